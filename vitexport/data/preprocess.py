"""What preprocessing is, as data: the fields of timm's eval transform that turn an image into the model's input.
The transform itself is `data.images`; each variant's defaults are `model.variants`; the manifest records one."""

from __future__ import annotations

from dataclasses import asdict, dataclass

INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes the model's input tensor (timm's data config)."""

    input_size: tuple[int, int]  # (H, W) fed to the model
    mean: tuple[float, float, float] = INCEPTION_MEAN
    std: tuple[float, float, float] = INCEPTION_STD
    crop_pct: float = 0.9  # resize the shorter side to size / crop_pct, then center-crop to size
    interpolation: str = "bicubic"  # resize filter: bicubic | bilinear | nearest

    def to_dict(self) -> dict:
        d = asdict(self)
        d["input_size"] = list(self.input_size)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Preprocess":
        return cls(
            input_size=tuple(d["input_size"]),  # type: ignore[arg-type]
            mean=tuple(d["mean"]),  # type: ignore[arg-type]
            std=tuple(d["std"]),  # type: ignore[arg-type]
            crop_pct=float(d["crop_pct"]),
            interpolation=str(d["interpolation"]),
        )
