"""The figures a row has beyond the table's columns, one line each: accuracy over the classes a set covers,
ImageNet-ReaL accuracy, and an embedding model's k-NN figures; and the timings whose median had not settled."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .run import BenchReport


def _pct(v: float, ci: list[float] | None) -> str:
    return f"{v:.2%}" + ("" if not ci else f" [{ci[0]:.1%}, {ci[1]:.1%}]")


def _drop(ci: list[float] | None) -> str:
    return "" if not ci else f", drop [{ci[0]:+.2f}, {ci[1]:+.2f}] pts"


def dense_text(st) -> str:
    """A dense output's task figures: 'AbsRel 0.0123 [0.0101, 0.0145], delta1 99.91% [99.8%, 100.0%]'."""
    if st.dense == "masks":
        text = (f"mask IoU {_pct(st.mask_iou, st.mask_iou_ci)} (per image, the mean over its prompts; mean over "
                f"{st.n:,} images, 95% interval), worst prompt {st.mask_iou_min:.2%}")
    elif st.dense == "detection":
        text = ("the reference finds nothing above its threshold: no mAP" if st.map is None else
                f"mAP {_pct(st.map, st.map_ci)}, AP50 {_pct(st.map_50, st.map_50_ci)} (COCO's, the reference's "
                f"detections as the truth; 95% bootstrap intervals over {st.n:,} images)") + \
            f", matched box IoU {_pct(st.box_iou, st.box_iou_ci)}, score difference {st.score_diff:.4f}"
    elif st.dense == "depth":
        text = (f"AbsRel {st.absrel:.4f} [{st.absrel_ci[0]:.4f}, {st.absrel_ci[1]:.4f}], delta1 "
                f"{_pct(st.delta1, st.delta1_ci)} (per image, mean over {st.n:,} images, 95% intervals)")
    else:
        text = (f"pixel agreement {_pct(st.pixel_agree, st.pixel_agree_ci)} (per image, mean over {st.n:,} images), "
                f"mIoU over the set {_pct(st.miou, st.miou_ci)} (95% intervals)")
    return text + ("" if not st.truth else "; " + truth_text(st.truth))


TRUTH_NAMES = {"map": "mAP", "map_50": "AP50", "map_small": "AP small", "map_medium": "AP medium",
               "map_large": "AP large", "absrel": "AbsRel", "delta1": "delta1", "miou": "mIoU", "pixel_acc": "pixel accuracy",
               "point_iou": "IoU of an object's point prompt", "box_iou": "IoU of its box prompt"}


def truth_text(truth: dict) -> str:
    """'against ground truth on 12 images: AbsRel 0.0812 [0.07, 0.09] (reference 0.0810, difference +0.0002
    [-0.0001, +0.0005]), ...'."""
    parts = [f"{TRUTH_NAMES[k]} {v['value']:.4f} [{v['ci'][0]:.4f}, {v['ci'][1]:.4f}] (reference {v['reference']:.4f}, "
             f"difference {v['diff']:+.4f} [{v['diff_ci'][0]:+.4f}, {v['diff_ci'][1]:+.4f}])"
             for k, v in truth.items() if k != "n"]
    return f"against ground truth on {truth['n']:,} images: " + ", ".join(parts)


def figure_lines(report: "BenchReport") -> list[str]:
    """Per available row, what its parity record holds beyond the table (none for a plain labelled set)."""
    out = []
    for r in report.results:
        st = r.parity.stats if r.available and r.parity else None
        if st is None:
            continue
        if st.acc_subset is not None:
            out.append(f"{r.name}: top-1 over the {st.subset_classes} classes present "
                       f"{_pct(st.acc_subset, st.acc_subset_ci)} (reference {st.acc_subset_ref:.2%}"
                       f"{_drop(st.acc_subset_drop_ci)})")
        if st.dense is not None:
            out.append(f"{r.name}: against the reference, {dense_text(st)}")
        if st.embedding:
            knn = "" if st.knn_acc is None else (f"k-NN top-1 {_pct(st.knn_acc, st.knn_acc_ci)} (reference "
                                                  f"{st.knn_acc_ref:.2%}{_drop(st.knn_drop_ci)}), ")
            out.append(f"{r.name}: {knn}nearest neighbour the same as the reference's for "
                       f"{_pct(st.neighbour_agree, st.neighbour_agree_ci)} (k={st.knn_k}, T={st.knn_t:g})")
        if st.real_acc is not None:
            out.append(f"{r.name}: ReaL top-1 {_pct(st.real_acc, st.real_acc_ci)} on {st.real_n:,} images "
                       f"(reference {st.real_acc_ref:.2%}{_drop(st.real_acc_drop_ci)})")
    return out


def unsettled_line(report: "BenchReport") -> str:
    """The timed rows whose median still moved when their time ran out (benchmark.latency: Latency.stable False), with
    their runs; '' when there are none (a served model's load is said apart, with its windows)."""
    from .latency import BUDGET_S, STABLE

    rows = [f"{r.name} batch {lat.batch} ({lat.iterations} runs)" for r in report.results if r.available
            for lat in r.latency if lat.concurrency is None and lat.stable is False]
    if not rows:
        return ""
    return (f"Timing stopped before the median settled (the last two runs moved it by more than {STABLE * 100:.0f} %; "
            f"{BUDGET_S:g} s of runs a configuration at most): {', '.join(rows)}; a busy machine, or use --iterations "
            f"N for more runs.")


def source_line(data: dict) -> str:
    """'Data: the 2,000 images of DIR, generated once from ...' for a default set that was generated ('' else)."""
    return f"Data: the {data['n']:,} images of {data['source']}, {data['generated']}." if data.get("generated") else ""


def labels_line(data: dict) -> str:
    """'Labels: 200 class folders read as WordNet synsets, 200 of the model's 1000 classes.' ('' unlabelled)"""
    lab = data.get("labels")
    if not lab:
        return ""
    cover = f", {lab['present']:,} of the model's {lab['num_classes']:,} classes" if lab.get("present") else ""
    return f"Labels: {lab['source']} read by {lab['how']}{cover}" + (", with ImageNet-ReaL labels" if lab.get("real")
                                                                     else "") + "."


def fastest_rows(d: dict) -> list[tuple[int, str, float, float | None]]:
    """Per timed batch size, the fastest CPU row (a served one aside) that passed its bounds: (batch, row, images/s,
    ratio to the reference); from the report's dict, so the table and the page say the same."""
    best: dict[int, tuple[int, str, float, float | None]] = {}
    for r in d["results"]:
        if not r.get("available") or r.get("device") != "cpu" or (r.get("parity") or {}).get("status") != "pass":
            continue
        for lat in r.get("latency") or []:
            if lat.get("concurrency") is None and lat.get("throughput") and \
                    lat["throughput"] > best.get(lat["batch"], (0, "", 0.0, None))[2]:
                best[lat["batch"]] = (lat["batch"], r["name"], lat["throughput"], lat.get("relative_to_reference"))
    return [best[b] for b in sorted(best)]


def fastest_line(d: dict) -> str:
    """'Fastest CPU row within its bounds: batch 1 openvino cpu int8 (2.85x the reference), batch 8 ...' ('' none)."""
    rows = fastest_rows(d)
    if not rows:
        return ""
    return "Fastest CPU row within its bounds: " + ", ".join(
        f"batch {b} {name}" + ("" if ratio is None else f" ({ratio:.2f}x the reference)") for b, name, _, ratio in rows)
