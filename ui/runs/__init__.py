"""Runs the pages show, one module per job. Allocation always happens in ``pagedkv_core``; these
modules only drive the engine's public API and keep what it records.

- :mod:`ui.runs.model`: :class:`~ui.runs.model.Run` (the fields every run has), its size in
  bytes, and how the pages name an allocator.
- :mod:`ui.runs.budgets`: byte caches and budgets: what a run holds before it starts, the note of
  a run stopped for its budget, and the process-wide cache of finished runs.
- :mod:`ui.runs.scripted`: workloads played to the end on the scripted source
  (:class:`~ui.runs.scripted.ScriptedRun`, with its memory-waste breakdown).
- :mod:`ui.runs.uploaded`: a downloaded trace replayed as a finished run.
- :mod:`ui.runs.live`: the real-model pair the page steps live (:class:`~ui.runs.live.LiveRun`,
  with its token texts, KV pools and answers).
- :mod:`ui.runs.session`: the Streamlit layer: what a browser session keeps (its byte cache, the
  uploads, the live pair and its stepper) and the errors and warnings the pages show.
- :mod:`ui.runs.sidebar`: the runs the sidebar's settings name (:func:`~ui.runs.sidebar.current_runs`).

Only ``session`` and ``sidebar`` import Streamlit, and only ``sidebar`` reads :mod:`ui.settings`;
:mod:`ui.settings` imports ``session`` and ``scripted`` (the sidebar's workload), never ``sidebar``.
"""
