"""PredNet on FPSI (First-Person Social Interactions) video: the CPU-versus-GPU study's predictive network.

    python launch.py --config=configs/prednet_fpsi.py --config.data.dir=/data/fpsi

What the study (Pietrowski et al., arXiv 2109.01451) gives: PredNet, trained in Chainer on FPSI first-person
videos for the same number of epochs on CPU-only and CPU+GPU machines, reached a higher loss on CPUs; a plain
autoencoder showed no difference. Its later version is retracted by the authors: the difference came from
Chainer and did not replicate in PyTorch. hwrepro's sweeps re-ask the question with explicit numerics controls.

What is assumed here (the study's exact model sizes, frame size, clip length and schedule are not taken from
its text): the reference KITTI PredNet (stack sizes 3-48-96-192, L_0, Adam 1e-3 -> 1e-4 halfway), frames
120x160 RGB (FPSI downscaled 1/8 keeping 4:3 and divisible by 8, the size used by the Chainer PredNet work
on illusory motion), clips of 10 frames, batch 4, 500 clips per epoch, 150 epochs.
data.dir holds train/ val/ test/ folders of extracted frames (one sub-folder per video) or
train.npz / val.npz / test.npz (X, sources); without it a synthetic stand-in of the same shape.
"""

import importlib.util
from pathlib import Path


def _kitti_config():
    """configs/prednet_kitti.py's config, loaded by path (configs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("prednet_kitti", Path(__file__).with_name("prednet_kitti.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config():
    c = _kitti_config()
    c.name = "prednet_fpsi"
    c.data.image_size = (120, 160)
    return c
