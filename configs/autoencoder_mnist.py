"""The CPU-versus-GPU study's plain MNIST autoencoder (arXiv 2109.01451).

    python launch.py --config=configs/autoencoder_mnist.py
    python launch.py --config=configs/autoencoder_mnist.py --config.data.dir=/data/mnist \
        --config.numerics.precision=bf16
"""

from hwrepro.config_base import base_config


def get_config():
    c = base_config("autoencoder")
    c.name = "autoencoder_mnist"
    c.model = dict(encoder_sizes=(32,))  # Keras tutorial autoencoder: 784 -> 32 -> 784 (the study gives no sizes)
    c.data.seed = 0                       # synthetic stand-in's seed, kept apart from the training seed
    c.train.batch_size = 256
    c.train.num_epochs = 10
    c.train.learning_rate = 1e-3
    c.train.log_every = 50
    c.train.eval_every = 500
    return c
