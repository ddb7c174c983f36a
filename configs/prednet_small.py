"""A small PredNet on synthetic bouncing squares, sized for 2 CPU cores. It beats the copy-last-frame baseline
clearly; tests and the CPU-versus-GPU sweep use it.

    python launch.py --config=configs/prednet_small.py
"""

from hwrepro.harness.config import base_config


def get_config():
    c = base_config("prednet")
    c.name = "prednet_small"
    c.model = dict(
        name="prednet",                   # a model of hwrepro/models/ (MODELS)
        stack_sizes=(1, 8, 16),
        R_stack_sizes=(1, 8, 16),
        A_filt_sizes=(3, 3),
        Ahat_filt_sizes=(3, 3, 3),
        R_filt_sizes=(3, 3, 3),
        pixel_max=1.0,
        layer_loss_weights="L_0",
    )

    c.data.dataset = "video"          # a "video" data set of hwrepro/data/ (or moving_mnist)
    c.data.image_size = (32, 32)
    c.data.channels = 1
    c.data.nt = 8
    c.data.resize = "area"
    c.data.seed = 0
    c.data.num_val_clips = 64
    c.data.num_test_clips = 0
    c.data.synthetic = dict(num_videos=128, frames_per_video=24, num_objects=2, shape="square",
                            object_size=(6.0, 10.0), speed=(1.0, 2.5))
    c.data.synthetic_eval_videos = 32
    c.data.val_fraction = 0.1         # a video file (data.dir=x.avi): its middle 10% validates,
    c.data.test_fraction = 0.2        # its final 20% is the held-out test
    c.data.frame_step = 1             # a video file: every k-th frame (a lower frame rate)

    c.train.batch_size = 16
    c.train.samples_per_epoch = 1600
    c.train.num_epochs = 4
    c.train.learning_rate = 3e-3
    c.train.lr_drop_fraction = 0.5
    c.train.lr_drop_factor = 0.1
    c.train.adam_eps = 1e-8
    c.train.log_every = 50
    c.train.eval_every = 0

    c.eval = dict(batch_size=32, extrap_start_time=0)
    return c
