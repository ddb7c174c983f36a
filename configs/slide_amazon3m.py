"""SLIDE on Amazon-3M (2,812,281 labels), its output layer split over two devices.

    python launch.py --config=configs/slide_amazon3m.py
    python launch.py --config=configs/slide_amazon3m.py --config.data.dir=/data/xc   # holds Amazon-3M/train.txt

Without the real files it trains on a synthetic stand-in with Amazon-3M's sizes (337,067 features, 2,812,281
labels, 1,717,899 train / 742,507 test points; features and labels per point copied from Amazon-670K's).
Defaults are slide_amazon.py's, plus a mesh: W, b, their Adam moments and the LSH tables split by label over
parallel.model = 2 CPU devices (numerics.cpu_devices = 2), one half per device. On a multi-GPU machine:
--config.numerics.platform=gpu --config.numerics.cpu_devices=0 --config.parallel.model=<GPUs>.
"""

from configs.slide_amazon import slide_config


def get_config():
    c = slide_config("amazon3m", "lsh")
    c.parallel.model = 2
    c.numerics.cpu_devices = 2
    return c
