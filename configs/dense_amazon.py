"""Amazon-670K with dense softmax: SLIDE's baseline in the same harness (see configs/slide_amazon.py)."""

from configs.slide_amazon import slide_config


def get_config():
    c = slide_config("amazon670k", "dense")
    # The dense step's temporaries are whole [670,091, 128] arrays (343 MB each). Kept in one glibc arena
    # they fragment it: some benchmark runs had several times slower steps at about twice the memory. With
    # glibc's default (off) the peak was the same in every run (docs/benchmarks.md, "bf16, ISA cap, huge
    # pages, freed-memory reuse").
    c.numerics.keep_freed_memory = False
    # A fair ceiling: at SLIDE's Adam (lr 1e-3, eps 1e-8) dense softmax stays at the label prior for the first
    # 1,000 steps; at lr 1e-2 and eps 1e-5 it learns fastest of the settings tried (docs/slide_costs.md, "A
    # fair dense ceiling").
    c.train.learning_rate = 1e-2
    c.train.adam_eps = 1e-5
    return c
