"""SLIDE word2vec on Text8: skip-gram, 200 hidden units, LSH output over the vocabulary (SLIDE MLSys 2021).

data.dir holding the `text8` file trains on it; otherwise a synthetic Zipfian corpus of text8's size. Any
plain-text file (gzip or dictzip too), tokenised as Text8 (lowercase a-z words):

    python launch.py --config=configs/slide_text8.py --config.data.source=text \
        --config.data.dir=/usr/share/dictd/gcide.dict.dz --config.train.checkpoints=1

train.checkpoints=1 keeps the final word vectors in trajectory.npz for benchmarks/word_neighbours.py.
"""

from configs.slide_amazon import slide_config


def get_config():
    c = slide_config("text8", "lsh")
    c.model.hidden = 200              # SLIDE's word2vec hidden layer
    c.model.num_candidates = 4096
    c.data.max_features = 1           # the centre word
    c.data.max_labels = c.data.get_ref("window") * 2  # the context words: follows --config.data.window
    c.train.num_steps = 5000          # an epoch: the words subsampling keeps / 128 batches; raise for full runs
    c.train.eval_every = 1000
    c.eval.final_points = 2048        # final P@k on held-out centres (0: all); the subset's draw while equal
    return c
