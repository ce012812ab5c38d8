"""Predict, then reveal: a question that the lesson's run answers, asked before the run shows it.

Why: what learners *do* with a visualization matters more than what it shows (Hundhausen et al.
2002; Naps et al.'s engagement taxonomy, ITiCSE 2002), and predicting before seeing is the
cheapest step up from watching. A :class:`Prediction` is plain data that a lesson builds from its
recorded run, so the answer it reveals is the one the engine measured, never a number typed into
the page. :func:`ask` draws it: multiple choice or a number, then, once answered, the measured
answer and one sentence of why. The first answer to each question counts towards the session's
score (:func:`score`), kept in ``st.session_state``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import streamlit as st

from ui import presenter

PREFIX = "Predict:"
SLIDE_WHY_CHARS = 260  # in presenter mode a longer why is folded into an expander under the answer
_RECORD = "_predictions"  # session_state: widget key -> (guess, right?) of the first answer


@dataclass(frozen=True)
class Prediction:
    """One question. ``answer``: the measured value, one of ``options`` (multiple choice) or a
    number (no options); a number guess within ``tolerance`` of it counts as right."""

    key: str
    question: str
    answer: object
    why: str
    options: tuple[str, ...] = ()
    tolerance: float = 0.0
    unit: str = ""
    source: str = "Measured in this run"  # how the answer was obtained, said when it is revealed

    def __post_init__(self):
        if not self.question.startswith(PREFIX):
            raise ValueError(f"a prediction's question must start with {PREFIX!r}: {self.question!r}")
        if self.options:
            if self.answer not in self.options:
                raise ValueError(f"{self.key}: the answer {self.answer!r} is not one of the options {self.options}")
        elif isinstance(self.answer, bool) or not isinstance(self.answer, (int, float)) or not math.isfinite(self.answer):
            raise ValueError(f"{self.key}: a number question needs a finite number as its answer, got {self.answer!r}")
        if self.tolerance < 0:
            raise ValueError(f"{self.key}: tolerance must be >= 0, got {self.tolerance}")

    @property
    def is_choice(self) -> bool:
        return bool(self.options)

    def grade(self, guess) -> bool:
        if self.is_choice:
            return guess == self.answer
        return abs(float(guess) - float(self.answer)) <= self.tolerance + 1e-9

    def answer_text(self) -> str:
        """The measured answer in words: the option, or the number with its unit."""
        if self.is_choice:
            return str(self.answer)
        return f"{number_text(self.answer)} {self.unit}".strip()


def number_text(value) -> str:
    """A whole number with thousands separators, anything else to 3 significant digits."""
    value = float(value)
    return f"{int(value):,}" if value.is_integer() else f"{value:,.3g}"


def in_range(value: float, ranges: list[tuple[str, float]]) -> str:
    """The label of the first range whose upper bound (exclusive) exceeds ``value``; the last
    label catches the rest. For multiple-choice questions over a measured number."""
    for label, upper in ranges[:-1]:
        if value < upper:
            return label
    return ranges[-1][0]


def range_options(value: float, ranges: list[tuple[str, float]]) -> dict:
    """``options`` and ``answer`` keyword arguments of a Prediction over ``ranges``."""
    return {"options": tuple(label for label, _ in ranges), "answer": in_range(value, ranges)}


def _record() -> dict:
    return st.session_state.setdefault(_RECORD, {})


def widget_key(scope: str, p: Prediction) -> str:
    return f"predict_{scope}_{p.key}"


def score() -> tuple[int, int]:
    """(right, answered) over every prediction answered in this session."""
    rec = _record()
    return sum(1 for _, right in rec.values() if right), len(rec)


def score_text() -> str:
    right, answered = score()
    if not answered:
        return "Predictions this session: none answered yet."
    return f"Predictions this session: **{right} right** of {answered} answered."


def ask(p: Prediction, scope: str) -> bool | None:
    """Draw the question; once answered, the measured answer and why. Returns whether the
    first answer was right, or None while unanswered. The first answer stands (the widget gives
    way to it), so the score counts predictions, not second tries."""
    key = widget_key(scope, p)
    rec = _record()
    given = st.session_state.get(key)  # the answer just given, before the widget is drawn again
    if key not in rec and given is not None:
        rec[key] = (given, p.grade(given))
    locked = key in rec
    if locked:  # the first answer stands: the question, what was said, and the measured answer
        said, right, verdict, folded = _answered_text(p, scope)
        st.markdown(said)
        if right:
            st.success(verdict, icon=":material/check_circle:")
        else:
            st.warning(verdict, icon=":material/lightbulb:")
        if folded:
            st.expander("Why", icon=":material/help:").markdown(p.why)
        return right
    if p.is_choice:
        st.radio(p.question, p.options, index=None, key=key, horizontal=_horizontal(p))
        st.caption(HINT)
    else:  # a short input, the hint beside it
        left, right_col = st.columns([3, 2], vertical_alignment="bottom")
        left.number_input(p.question, value=None, key=key, step=1.0 if p.tolerance >= 1 or float(p.answer).is_integer() else None,
                          placeholder="your guess, then Enter",
                          help=f"Counts as right within ±{p.tolerance:g}{' ' + p.unit if p.unit else ''}."
                          if p.tolerance else "Counts as right when exact.")
        right_col.caption(HINT)
    return None


HINT = "Answer to reveal what the run measured."


def _horizontal(p: Prediction) -> bool:
    return sum(len(o) for o in p.options) < 110


def _answered_text(p: Prediction, scope: str) -> tuple[str, bool, str, bool]:
    """What an answered question shows: the question with what was said, whether the first answer
    was right, the measured answer with its why, and whether the why is folded into an expander (a
    long one, on a slide: it would push the figure off the screen)."""
    first, right = _record()[widget_key(scope, p)]
    said = first if p.is_choice else number_text(first)
    folded = presenter.on(scope) and len(p.why) > SLIDE_WHY_CHARS
    why = "" if folded else f" {p.why}"
    verdict = f"**{'Right' if right else 'Not quite'}.** {p.source}: **{p.answer_text()}**.{why}"
    return f"{p.question} You said **{said}**.", right, verdict, folded


def slide_px(p: Prediction, scope: str) -> int:
    """The height :func:`ask` takes on a slide (:mod:`ui.presenter`'s estimate, in px), as drawn
    now: the question and its widget, or once answered the question, the answer and its why."""
    g = presenter.GAP_PX
    if answered(p, scope):
        said, _, verdict, folded = _answered_text(p, scope)
        return presenter.line_px(said) + g + presenter.box_px(verdict) + (g + presenter.EXPANDER_PX if folded else 0)
    if not p.is_choice:
        label = presenter.lines(p.question, presenter.NUMBER_LABEL_CHARS)  # the label wraps in its column
        return round(presenter.LINE_PX * label) + presenter.NUMBER_INPUT_PX
    options = presenter.CHOICES_PX if _horizontal(p) else len(p.options) * presenter.CHOICES_PX * 3 // 4
    return presenter.line_px(p.question) + options + g + presenter.caption_px(HINT)


def answered(p: Prediction, scope: str) -> bool:
    return widget_key(scope, p) in _record()
