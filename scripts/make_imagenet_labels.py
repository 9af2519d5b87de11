"""Write vitexport/resources/imagenet1k_labels.tsv: ImageNet-1k's 1000 classes in classifier order, one
`<WordNet synset>\t<lemmas>` line each, from the copy timm ships inside its wheel (no network).

    python scripts/make_imagenet_labels.py     # needs timm (pip install -e ".[test]")

Source and licence: vitexport/resources/SOURCES.md.
"""

from pathlib import Path

from timm.data import ImageNetInfo

OUT = Path(__file__).resolve().parents[1] / "vitexport" / "resources" / "imagenet1k_labels.tsv"


def main() -> None:
    info = ImageNetInfo("imagenet-1k")
    lines = [f"{info.index_to_label_name(i)}\t{info.index_to_description(i)}" for i in range(info.num_classes())]
    assert len(lines) == 1000 and all("\t" not in line.split("\t", 1)[1] for line in lines)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT} ({len(lines)} classes)")


if __name__ == "__main__":
    main()
