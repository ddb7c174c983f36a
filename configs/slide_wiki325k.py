"""SLIDE on WikiLSH-325K (325,056 labels; synthetic stand-in of its shape unless data.dir holds the files)."""

from configs.slide_amazon import slide_config


def get_config():
    c = slide_config("wikilsh325k", "lsh")
    c.data.max_features = 96          # ~42 features per point
    return c
