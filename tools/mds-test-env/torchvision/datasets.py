"""What ``streaming.vision`` subclasses at import time; never instantiated by the tests."""


class VisionDataset:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchvision placeholder (atlas_fast MDS tests): not usable")


CIFAR10 = VisionDataset
