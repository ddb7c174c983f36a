"""Amazon-670K with dense softmax: SLIDE's baseline in the same harness (see configs/slide_amazon.py)."""

from configs.slide_amazon import slide_config


def get_config():
    return slide_config("amazon670k", "dense")
