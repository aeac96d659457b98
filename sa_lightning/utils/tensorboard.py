"""Reading back what a run logged to TensorBoard."""
from __future__ import annotations

from pathlib import Path


def scalars(log_dir: str | Path, tags: list[str]) -> dict[int, dict[str, float]]:
    """``{step: {tag: value}}`` of ``tags`` over every ``version_*`` folder under ``log_dir`` (a TensorBoard logger's
    folder), merged by step, a later version's value winning: a resumed run's series read as one. Empty where nothing
    was logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    by_step: dict[int, dict[str, float]] = {}
    versions = sorted((p for p in Path(log_dir).glob("version_*") if p.is_dir() and p.name[8:].isdigit()),
                      key=lambda p: int(p.name[8:]))  # older first
    for version in versions if tags else []:
        events = EventAccumulator(str(version), size_guidance={"scalars": 0}).Reload()
        logged = set(events.Tags().get("scalars", []))
        for tag in (t for t in tags if t in logged):
            for event in events.Scalars(tag):
                by_step.setdefault(int(event.step), {})[tag] = float(event.value)
    return by_step
