"""The CPU-versus-GPU study's plain MNIST autoencoder (arXiv 2109.01451).

    python launch.py --config=configs/autoencoder_mnist.py
    python launch.py --config=configs/autoencoder_mnist.py --config.data.dir=/data/mnist \
        --config.numerics.precision=bf16
"""

from hwrepro.harness.config import base_config


def get_config():
    c = base_config("autoencoder")
    c.name = "autoencoder_mnist"
    c.data.dataset = "mnist"              # an "images" data set of hwrepro/data/
    # A model of hwrepro/models/ (MODELS) and its fields. Keras tutorial autoencoder: 784 -> 32 -> 784 (the
    # study gives no sizes).
    c.model = dict(name="mlp_autoencoder", encoder_sizes=(32,))
    c.data.seed = 0                       # synthetic stand-in's seed, kept apart from the training seed
    c.train.batch_size = 256
    c.train.num_epochs = 10
    c.train.learning_rate = 1e-3
    c.train.log_every = 50
    c.train.eval_every = 500
    return c
