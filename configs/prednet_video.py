"""PredNet on a real video file (OpenCV's vtest.avi by default).

The fixed-camera pedestrian scene of OpenCV's examples (vtest.avi, 795 frames, 768x576, 10 fps), every 3rd
frame (3.3 fps: at 10 fps people move well under a pixel per frame at this size), grey, scaled to 48x64. Of
those 265 frames the first 70% train, the next 10% validate, the final 20% (53 frames) are the held-out test.

    apt-get install opencv-doc && pip install -e '.[video]'
    python launch.py --config=configs/prednet_video.py
    python launch.py --config=configs/prednet_video.py --config.data.dir=my_video.mp4

Any .avi/.mp4 (or a folder of them) works as data.dir; data.channels=3 reads colour (then model.stack_sizes
and R_stack_sizes start with 3). Results: docs/results.md.
"""

from configs import prednet_small

VTEST = "/usr/share/doc/opencv-doc/examples/data/vtest.avi"  # Debian package opencv-doc


def get_config():
    c = prednet_small.get_config()
    c.name = "prednet_video"
    c.data.dir = VTEST
    c.data.image_size = (48, 64)       # 768x576 scaled 12x, no crop (same 4:3)
    c.data.frame_step = 3
    c.data.nt = 8
    c.data.num_val_clips = 0           # every non-overlapping clip of the held-out parts
    c.data.num_test_clips = 0
    c.train.batch_size = 8
    c.train.samples_per_epoch = 1600
    c.train.num_epochs = 6             # 1,200 steps
    c.train.log_every = 100
    return c
