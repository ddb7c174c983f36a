"""The PredNet sweep on a real video (OpenCV's vtest.avi).

configs/sweep_prednet.py's set-ups and seeds on prednet_video (grey 48x64, 1 frame in 3, 8-frame clips)
trained 96 steps of batch 8, evaluated on the video's held-out final 20%.

    python launch.py --config=configs/sweep_prednet_video.py --workdir=runs/sweep_prednet_video

Needs the video (`apt-get install opencv-doc`, `pip install -e '.[video]'`; another file: --config.data.dir).
Sized for 40 minutes on 2 shared cores (docs/results.md), so no point estimates the Hessian (on these frames
compiling Lanczos through the ConvLSTM costs more than the sweep's whole budget allows; configs/sweep_prednet.py
has it): the report compares final losses, bits and divergence only.
"""

from configs import prednet_video
from configs.sweep_prednet import as_sweep


def get_config():
    c = prednet_video.get_config()
    c.train.samples_per_epoch = 768   # 1 epoch of 96 steps of batch 8
    c.train.num_epochs = 1
    return as_sweep(c, "sweep_prednet_video", hessian_iters=0)
