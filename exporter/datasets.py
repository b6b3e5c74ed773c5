"""Torch datasets for training: the demo splits, or any torchvision ``ImageFolder``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import datasets, transforms

from exporter.demo_data import load_split

#: ImageNet statistics; recorded in the manifest, applied by the runtime.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def normalise_uint8(images: np.ndarray) -> torch.Tensor:
    """(N, H, W, 3) uint8 RGB -> (N, 3, H, W) float32, normalised exactly as ``models.preprocess`` does."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (x - mean) / std


class Uint8ImageDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Images kept as uint8 (100,000 frames are 2.8 GB so, 11 GB as float32), normalised per item."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = torch.from_numpy(np.asarray(labels)).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return normalise_uint8(self.images[i : i + 1])[0], self.labels[i]


def demo_split_dataset(path: Path) -> tuple[Uint8ImageDataset, list[str]]:
    images, labels, names = load_split(path)
    return Uint8ImageDataset(images, labels), names


def image_folder_dataset(root: Path, input_size: int) -> tuple[Dataset[tuple[torch.Tensor, int]], list[str]]:
    """A user's own frames: ``root/CLASS_NAME/*.jpg``; resized to the model input like the runtime does."""
    tf = transforms.Compose([
        transforms.Resize((input_size, input_size)),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])
    ds = datasets.ImageFolder(str(root), transform=tf)
    return ds, list(ds.classes)


def random_shift(x: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Augmentation: translate a batch by up to ``max_shift`` pixels (reflect padding)."""
    if max_shift <= 0:
        return x
    h, w = x.shape[-2:]
    padded = torch.nn.functional.pad(x, [max_shift] * 4, mode="reflect")
    dy, dx = (int(v) for v in torch.randint(0, 2 * max_shift + 1, (2,), generator=generator))
    return padded[..., dy : dy + h, dx : dx + w]
