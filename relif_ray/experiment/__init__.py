"""The experiment directory a sweep writes and analysis reads (no Ray import).

`storage`: where it lives (a local path or a URI; the one place that decides which, read once
into a `StorageLocation`); `layout`: where a trial's files lie in it; `record`: what a trial
reports (its epoch results and its trial.json), keyed in one place; `outputs`: the outputs of a
finished trial; `lock`: one sweep at a time per experiment directory; `export`: copy only what
analysis reads.
"""
