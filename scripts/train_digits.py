#!/usr/bin/env python
"""Train the labelled accuracy fixture: vit_digits_patch4_32 on scikit-learn's handwritten digits.

What it does (and what it writes, relative to --out-root, the repository root by default):

1. load_digits() -> 1,797 8x8 images (values 0..16), each turned into an 8-bit grayscale PIL image
   (round(value * 255 / 16)); exactly these pixels are what the PNGs hold.
2. Split stratified, 20% held out: train_test_split(indices, test_size=0.2, stratify=y, random_state=0).
3. Train build_model(get_variant("vit_digits_patch4_32").config(), seed) with AdamW + warmup/cosine schedule,
   label smoothing and random +-1 px shifts in the 8x8 domain. Every input goes through
   vitexport.data.images.preprocess_image -- the inference-time preprocessing -- so train and eval cannot disagree.
4. Write
     calibration/digits/heldout/<class>/<index>.png   the held-out split (index = position in load_digits())
     calibration/digits/calib/<index>.png             200 training images (20 per class) for INT8 calibration
     models/digits/vit_digits_patch4_32.safetensors   the FP32 state dict
     models/digits/README.md, calibration/digits/README.md
5. Reload the held-out PNGs from disk with vitexport.data.images.load_folder and report top-1 accuracy on them.

    python scripts/train_digits.py                     # the shipped fixture
    python scripts/train_digits.py --epochs 1 --out-root /tmp/digits   # a quick smoke run elsewhere
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from vitexport.data.images import load_folder, preprocess_image  # noqa: E402
from vitexport.model.variants import DIGITS_VARIANT, SIZES, get_variant  # noqa: E402
from vitexport.model.build import build_model, count_params  # noqa: E402
from vitexport.paths import DIGITS_CALIB, DIGITS_CHECKPOINT, DIGITS_HELDOUT  # noqa: E402

SPLIT_RANDOM_STATE = 0  # fixed: the shipped split does not depend on --seed
TEST_SIZE = 0.2
CALIB_PER_CLASS = 20  # 10 classes -> 200 calibration images


# -- data ------------------------------------------------------------------------------------------------

def digits_to_uint8(images: np.ndarray) -> np.ndarray:
    """(N, 8, 8) values 0..16 -> (N, 8, 8) uint8, round(value * 255 / 16)."""
    return np.rint(images.astype(np.float64) * 255.0 / 16.0).astype(np.uint8)


def to_pil(img8: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(img8), mode="L")


def split_indices(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stratified 80/20 split of load_digits() positions (train, held-out), both sorted."""
    from sklearn.model_selection import train_test_split

    train_idx, test_idx = train_test_split(np.arange(len(y)), test_size=TEST_SIZE, stratify=y,
                                           random_state=SPLIT_RANDOM_STATE)
    return np.sort(train_idx), np.sort(test_idx)


def calib_indices(train_idx: np.ndarray, y: np.ndarray) -> np.ndarray:
    """CALIB_PER_CLASS training images per class, chosen by a fixed RNG (never held-out ones)."""
    rng = np.random.RandomState(SPLIT_RANDOM_STATE)
    chosen = []
    for c in range(10):
        members = train_idx[y[train_idx] == c]
        chosen.append(rng.choice(members, size=CALIB_PER_CLASS, replace=False))
    return np.sort(np.concatenate(chosen))


def shift(img8: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Translate an 8x8 image by whole pixels, filling with background (0)."""
    out = np.zeros_like(img8)
    h, w = img8.shape
    out[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        img8[max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def shifted_inputs(images8: np.ndarray, pp) -> np.ndarray:
    """(9, N, 3, H, W): every image under each of the 9 shifts in {-1, 0, 1}^2, through preprocess_image.

    The shifts are applied to the 8x8 PIL-able image before preprocess_image, exactly like a shifted PNG
    would be read at inference time. Precomputed once: 9 x N small images is cheap and keeps epochs fast.
    """
    shifts = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    out = np.empty((len(shifts), len(images8), 3, *pp.input_size), dtype=np.float32)
    for s, (dy, dx) in enumerate(shifts):
        for i, img in enumerate(images8):
            out[s, i] = preprocess_image(to_pil(shift(img, dy, dx)), pp)
    return out


# -- outputs ---------------------------------------------------------------------------------------------

def write_pngs_atomically(target: Path, items: list[tuple[str, np.ndarray]]) -> None:
    """Write (relative name, 8x8 uint8) PNGs into a fresh sibling folder, then swap it in for `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700 folders; the shipped ones are ordinary
        for rel, img8 in items:
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            to_pil(img8).save(p, format="PNG")
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.old.{os.getpid()}"
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_checkpoint(model: torch.nn.Module, path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(sd, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; the shipped one is ordinary
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- training --------------------------------------------------------------------------------------------

def lr_at(step: int, total: int, warmup: int, base_lr: float, min_lr: float) -> float:
    if step < warmup:
        return base_lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * t))


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: np.ndarray, batch: int = 256) -> np.ndarray:
    model.eval()
    preds = []
    for i in range(0, len(x), batch):
        preds.append(model(torch.from_numpy(x[i:i + batch])).argmax(-1).numpy())
    return np.concatenate(preds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0, help="model init, batch order and augmentation (not the split)")
    ap.add_argument("--out-root", type=Path, default=REPO_ROOT, help="where models/ and calibration/ go")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--warmup-epochs", type=int, default=3)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (results are reproducible per value)")
    ap.add_argument("--min-accuracy", type=float, default=0.95,
                    help="exit non-zero if held-out top-1 is below this (0 to disable, e.g. for smoke runs)")
    args = ap.parse_args(argv)

    from sklearn.datasets import load_digits

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.RandomState(args.seed)
    out = args.out_root.resolve()

    variant = get_variant(DIGITS_VARIANT)
    cfg, pp = variant.config(), variant.preprocess()

    digits = load_digits()
    images8, y = digits_to_uint8(digits.images), digits.target.astype(np.int64)
    train_idx, test_idx = split_indices(y)
    calib_idx = calib_indices(train_idx, y)
    assert not set(calib_idx.tolist()) & set(test_idx.tolist())
    print(f"digits: {len(y)} images; train {len(train_idx)}, held-out {len(test_idx)}, calib {len(calib_idx)} "
          f"(from train)", flush=True)

    # write the data files first: evaluation reads the held-out split back from these PNGs
    heldout_dir, calib_dir = out.joinpath(*DIGITS_HELDOUT), out.joinpath(*DIGITS_CALIB)
    write_pngs_atomically(heldout_dir, [(f"{y[i]}/{i:04d}.png", images8[i]) for i in test_idx])
    write_pngs_atomically(calib_dir, [(f"{i:04d}.png", images8[i]) for i in calib_idx])

    t0 = time.perf_counter()
    x_aug = shifted_inputs(images8[train_idx], pp)  # (9, N_train, 3, 32, 32)
    y_train = torch.from_numpy(y[train_idx])
    print(f"preprocessed {x_aug.shape[0]} x {x_aug.shape[1]} training inputs {tuple(x_aug.shape[2:])} "
          f"in {time.perf_counter() - t0:.1f}s", flush=True)

    model = build_model(cfg, seed=args.seed).train()
    n_params = count_params(model)
    D, depth, heads, mlp = SIZES[variant.size]
    print(f"{DIGITS_VARIANT}: D={D} depth={depth} heads={heads} mlp_ratio={mlp} -> {n_params:,} parameters",
          flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "pos_embed" not in n and "cls_token" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "pos_embed" not in n
                                                                and "cls_token" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.999))
    n_train = len(train_idx)
    steps_per_epoch = math.ceil(n_train / args.batch_size)
    total = args.epochs * steps_per_epoch
    warmup = min(args.warmup_epochs * steps_per_epoch, max(total - 1, 1))

    t_train = time.perf_counter()
    step = 0
    for epoch in range(args.epochs):
        model.train()
        order = rng.permutation(n_train)
        shift_choice = rng.randint(0, x_aug.shape[0], size=n_train)
        # un-shifted inputs 1/3 of the time, a random +-1 px shift otherwise
        shift_choice[rng.rand(n_train) < 1 / 3] = 4  # index 4 = (0, 0)
        loss_sum, correct = 0.0, 0
        for b in range(0, n_train, args.batch_size):
            idx = order[b:b + args.batch_size]
            xb = torch.from_numpy(x_aug[shift_choice[idx], idx])
            yb = y_train[idx]
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, warmup, args.lr, args.lr * 0.01)
            logits = model(xb)
            loss = F.cross_entropy(logits, yb, label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(-1) == yb).sum().item()
        print(f"epoch {epoch + 1:3d}/{args.epochs}  loss {loss_sum / n_train:.4f}  train acc {correct / n_train:.4f}  "
              f"lr {opt.param_groups[0]['lr']:.2e}  elapsed {time.perf_counter() - t_train:.1f}s", flush=True)
    train_seconds = time.perf_counter() - t_train
    model.eval()

    # evaluate on the shipped files through the shipped preprocessing
    ds = load_folder(heldout_dir, pp)
    assert ds.labels is not None and ds.classes is not None
    labels = np.array([int(ds.classes[i]) for i in ds.labels])
    preds = evaluate(model, ds.x)
    acc = float((preds == labels).mean())
    per_class = {c: float((preds[labels == c] == c).mean()) for c in range(10)}
    print(f"held-out top-1 (from {len(ds)} PNGs via load_folder): {acc:.4f}  "
          f"({int((preds == labels).sum())}/{len(ds)})", flush=True)
    print("per class: " + "  ".join(f"{c}:{a:.3f}" for c, a in per_class.items()), flush=True)

    ckpt_path = out.joinpath(*DIGITS_CHECKPOINT)
    # one metadata key only: safetensors writes metadata in hash-map order, so more keys would make the
    # file's bytes (and its sha256) differ between otherwise identical runs; the README carries the rest
    save_checkpoint(model, ckpt_path, {"format": "pt"})
    size = ckpt_path.stat().st_size
    print(f"wrote {ckpt_path} ({size / 1024:.1f} KiB)", flush=True)

    cmd = "python scripts/train_digits.py"
    if args.epochs != 60 or args.seed != 0:
        cmd += f" --epochs {args.epochs} --seed {args.seed}"
    counts_test = np.bincount(y[test_idx], minlength=10)
    counts_train = np.bincount(y[train_idx], minlength=10)
    write_text_atomically(out / "models" / "digits" / "README.md", models_readme(
        cmd=cmd, args=args, D=D, depth=depth, heads=heads, mlp=mlp, n_params=n_params, size=size, acc=acc,
        n_correct=int((preds == labels).sum()), n_test=len(ds), per_class=per_class, train_seconds=train_seconds,
        n_train=n_train))
    write_text_atomically(out / "calibration" / "digits" / "README.md", calibration_readme(
        counts_train=counts_train, counts_test=counts_test, n_calib=len(calib_idx)))

    if acc < args.min_accuracy:
        print(f"held-out top-1 {acc:.4f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


# -- READMEs ---------------------------------------------------------------------------------------------

def models_readme(*, cmd, args, D, depth, heads, mlp, n_params, size, acc, n_correct, n_test, per_class,
                  train_seconds, n_train) -> str:
    per = " | ".join(f"{c}: {a * 100:.1f}%" for c, a in per_class.items())
    return f"""# vit_digits_patch4_32 — trained digits ViT (labelled accuracy fixture)

`vit_digits_patch4_32.safetensors` is a small Vision Transformer of this project's own architecture
(`vitexport.model.vit.VisionTransformer`, timm-compatible parameter names) trained on scikit-learn's
handwritten digits. It gives the export toolchain a real, labelled accuracy reference: FP32, exported and
quantised models can all be scored on `calibration/digits/heldout`.

## Architecture

Variant `vit_digits_patch4_32` (`vitexport/variants.py`, `SIZES["digits"] = ({D}, {depth}, {heads}, {mlp})`):

| | |
|---|---|
| input | 3 x 32 x 32 (8x8 grayscale digit, converted to RGB, upscaled bilinearly, mean = std = 0.5) |
| patch | 4 x 4 -> 8 x 8 = 64 patch tokens + 1 class token |
| width / depth / heads / MLP ratio | {D} / {depth} / {heads} / {mlp} |
| pooling / head | class token / Linear({D}, 10) |
| parameters | {n_params:,} |
| file | {size / 1024:.1f} KiB, safetensors, float32, `model.state_dict()` keys |

Load it with

```python
from safetensors.torch import load_file
from vitexport.model.build import build_model
from vitexport.model.variants import get_variant

v = get_variant("vit_digits_patch4_32")
model = build_model(v.config())
model.load_state_dict(load_file("models/digits/vit_digits_patch4_32.safetensors"), strict=True)
```

and feed it images through `vitexport.data.images.preprocess_image(img, v.preprocess())` (or `load_folder`).

## Data and split

scikit-learn's `load_digits()` (1,797 8x8 images, 10 classes; see `calibration/digits/README.md` for source
and licence). Each image's values 0..16 become an 8-bit grayscale image, `round(value * 255 / 16)`.
Split: `train_test_split(arange(1797), test_size=0.2, stratify=y, random_state=0)` ->
{n_train} training images, {n_test} held-out images (stratified by class). The held-out images are never
used for training, model selection or calibration.

## Training

```
{cmd}
```

- seed {args.seed} (`build_model(cfg, seed={args.seed})` init, `torch.manual_seed({args.seed})`, batch order and
  augmentation from `numpy.random.RandomState({args.seed})`); {args.threads} torch CPU threads
- {args.epochs} epochs, batch {args.batch_size}, AdamW (lr {args.lr:g}, betas 0.9/0.999, weight decay
  {args.weight_decay:g} on matrices only), {args.warmup_epochs} warmup epochs then cosine decay to 1% of the lr,
  gradient clipping at norm 1.0
- cross-entropy with label smoothing {args.label_smoothing:g}
- augmentation: a random whole-pixel shift in {{-1, 0, 1}}^2 of the 8x8 image (background fill) on 2/3
  of the samples; no flips or rotations
- every training input is produced by `vitexport.data.images.preprocess_image` from the 8x8 PIL image — the same
  function inference uses — so training and evaluation preprocessing cannot differ
- training (the epoch loop) took {train_seconds:.0f} s wall clock in the run that wrote this file, with
  {args.threads} torch CPU threads on a {os.cpu_count()}-core {cpu_name()} shared with other work (so the figure
  varies with load), torch {torch.__version__}

## Held-out accuracy (FP32)

**{acc * 100:.2f}% top-1** ({n_correct}/{n_test}), measured by reloading the shipped PNGs in
`calibration/digits/heldout/` with `vitexport.data.images.load_folder` (i.e. the shipped files through the shipped
preprocessing).

Per class: {per}

`tests/test_digits_fixture.py` checks the checkpoint still reaches >= 95% on those files.

## Reproducing

Running the command above from the repository root rewrites this file, the checkpoint and the
`calibration/digits/` folders. With the same seed, thread count and library versions the result is the same;
other thread counts or torch builds may change the last bits of the floating-point arithmetic and so the
weights slightly (and the accuracy by a sample or two).
"""


def cpu_name() -> str:
    from vitexport.environment import cpu_model

    return cpu_model()


def calibration_readme(*, counts_train, counts_test, n_calib) -> str:
    rows = "\n".join(f"| {c} | {counts_train[c] + counts_test[c]} | {counts_train[c]} | {counts_test[c]} |"
                     for c in range(10))
    return f"""# calibration/digits — scikit-learn handwritten digits

Labelled images for the `vit_digits_patch4_32` fixture (`models/digits/`), written by
`scripts/train_digits.py`.

| folder | contents |
|---|---|
| `heldout/<class>/<index>.png` | the held-out split, {int(counts_test.sum())} images, one folder per class `0`..`9` (ImageFolder layout) |
| `calib/<index>.png` | {n_calib} images from the **training** split ({CALIB_PER_CLASS} per class, chosen with `numpy.random.RandomState(0)`), flat, for INT8 calibration |

`<index>` is the image's position in `sklearn.datasets.load_digits()` order, zero-padded to 4 digits.
Calibration images never come from the held-out split, so quantised accuracy measured on `heldout/` is
not flattered by calibration.

Each PNG is the 8x8 image as 8-bit grayscale: the dataset's integer values 0..16 scaled by
`round(value * 255 / 16)` (0 = background, 255 = full ink). `vitexport.data.images.preprocess_image` turns it into the
model input (RGB, bilinear upscale to 32x32, mean = std = 0.5).

## Split

`sklearn.model_selection.train_test_split(numpy.arange(1797), test_size=0.2, stratify=load_digits().target,
random_state=0)` — stratified by class, 20% held out.

| class | total | train | held-out |
|---|---|---|---|
{rows}
| all | {int(counts_train.sum() + counts_test.sum())} | {int(counts_train.sum())} | {int(counts_test.sum())} |

## Source and licence

The images are scikit-learn's bundled copy of the UCI *Optical Recognition of Handwritten Digits* dataset
(`sklearn.datasets.load_digits`). scikit-learn's description (`sklearn/datasets/descr/digits.rst`) says:

> This is a copy of the test set of the UCI ML hand-written digits datasets
> https://archive.ics.uci.edu/ml/datasets/Optical+Recognition+of+Handwritten+Digits

> Creator: E. Alpaydin (alpaydin '@' boun.edu.tr); Date: July; 1998

> Preprocessing programs made available by NIST were used to extract normalized bitmaps of handwritten
> digits from a preprinted form. From a total of 43 people, 30 contributed to the training set and
> different 13 to the test set. 32x32 bitmaps are divided into nonoverlapping blocks of 4x4 and the number
> of on pixels are counted in each block. This generates an input matrix of 8x8 where each element is an
> integer in the range 0..16.

That description states no licence. The dataset is distributed by the UCI Machine Learning Repository under
the Creative Commons Attribution 4.0 International licence (CC BY 4.0); attribution: E. Alpaydin and
C. Kaynak, *Optical Recognition of Handwritten Digits*, UCI Machine Learning Repository, 1998.
scikit-learn itself (which ships the data file) is BSD-3-Clause licensed.
The PNGs here are a format conversion of that data (values rescaled from 0..16 to 0..255).

## Regenerating

```
python scripts/train_digits.py
```

from the repository root rewrites both folders (and retrains the checkpoint). The split and calibration
selection depend only on scikit-learn's data and the fixed `random_state=0`, not on `--seed`.
"""


if __name__ == "__main__":
    raise SystemExit(main())
