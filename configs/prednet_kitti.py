"""PredNet on KITTI, the reference set-up (coxlab/prednet kitti_train.py; Lotter et al. 2016).

    python launch.py --config=configs/prednet_kitti.py --config.data.dir=/data/kitti_data
    python launch.py --config=configs/prednet_kitti.py --config.model.layer_loss_weights=L_all

data.dir holds the reference's processed arrays (X_train.hkl + sources_train.hkl, X_val.hkl, X_test.hkl;
.hkl needs the hickle package) or train.npz / val.npz / test.npz with arrays X and sources, or train/ val/
test/ folders of frame images with one sub-folder per video. Without it: synthetic bouncing discs of the
same shape (128x160x3, clips of 10), said plainly in the log and in run.json.
"""

from hwrepro.harness.config import base_config


def get_config():
    c = base_config("prednet")
    c.name = "prednet_kitti"
    c.model = dict(
        name="prednet",                   # a model of hwrepro/models/ (MODELS)
        stack_sizes=(3, 48, 96, 192),
        R_stack_sizes=(3, 48, 96, 192),
        A_filt_sizes=(3, 3, 3),
        Ahat_filt_sizes=(3, 3, 3, 3),
        R_filt_sizes=(3, 3, 3, 3),
        pixel_max=1.0,
        layer_loss_weights="L_0",    # the paper's L_0; L_all = [1, 0.1, 0.1, 0.1]
    )  # 6,915,948 parameters, as the reference model

    c.data.dataset = "video"          # a "video" data set of hwrepro/data/ (or moving_mnist)
    c.data.image_size = (128, 160)
    c.data.channels = 3
    c.data.nt = 10
    c.data.resize = "area"           # only used when frames are not already 128x160 (scale + centre crop)
    c.data.seed = 0                  # the synthetic stand-in's seed, kept apart from the training seed
    c.data.num_val_clips = 100       # reference N_seq_val (here: non-overlapping clips, the first 100)
    c.data.num_test_clips = 0        # 0 = every non-overlapping test clip (reference kitti_evaluate.py)
    c.data.synthetic = dict(num_videos=64, frames_per_video=30, num_objects=3, shape="disc",
                            object_size=(16.0, 40.0), speed=(1.5, 5.0))
    c.data.synthetic_eval_videos = 16
    c.data.val_fraction = 0.1         # a video file (data.dir=x.avi): its middle 10% validates,
    c.data.test_fraction = 0.2        # its final 20% is the held-out test
    c.data.frame_step = 1             # a video file: every k-th frame (a lower frame rate)

    c.train.batch_size = 4
    c.train.samples_per_epoch = 500  # reference: 125 steps of 4 clips per "epoch"
    c.train.num_epochs = 150
    c.train.checkpoint_every = 125   # once per "epoch": a 150-epoch run resumes where it was stopped
    c.train.learning_rate = 1e-3
    c.train.lr_drop_fraction = 0.5   # reference: 1e-3 for epochs 0-74, then 1e-4
    c.train.lr_drop_factor = 0.1
    c.train.adam_eps = 1e-8          # Keras 2.0 Adam default (later Keras: 1e-7)
    c.train.log_every = 125
    c.train.eval_every = 1250        # every 10 epochs; the reference validates every epoch

    c.eval = dict(batch_size=4, extrap_start_time=0)  # extrap_start_time > 0: also multi-step extrapolation MSE
    return c
