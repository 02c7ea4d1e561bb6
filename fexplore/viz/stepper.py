"""The stepper: an ipywidgets panel to walk through a compile, one stage at a time.

    ex.widget()

A stage selector with previous/next buttons (next runs the next stage when it has not run yet),
a view switch (diff, graph, IR, statistics, the pipeline overview), and the chosen view below.
Rendered views are cached, so going back and forth is instant.
"""

from __future__ import annotations

import ipywidgets as widgets

from .exploration_view import overview_table
from .page import esc, wrap
from .stage_view import header_html, verification_html, view_html

VIEW_LABELS = {"diff": "diff", "graph": "graph", "IR": "ir", "stats": "stats",
               "pipeline": "pipeline"}


class Stepper(widgets.VBox):
    def __init__(self, ex, *, view: str = "graph"):
        self.ex = ex
        self._cache: dict[tuple[str, str], str] = {}
        self._syncing = False
        self.prev_button = widgets.Button(description="◀ previous", tooltip="the stage before",
                                          layout=widgets.Layout(width="110px"))
        self.next_button = widgets.Button(description="next ▶", tooltip="the next stage "
                                          "(runs it when it has not run yet)",
                                          layout=widgets.Layout(width="110px"))
        self.run_all_button = widgets.Button(description="run all", tooltip="run every stage left",
                                             layout=widgets.Layout(width="90px"))
        self.stage = widgets.Dropdown(description="stage", layout=widgets.Layout(width="260px"))
        self.view = widgets.ToggleButtons(options=list(VIEW_LABELS), value=_label(view),
                                          style={"button_width": "80px"})
        self.status = widgets.HTML()
        self.content = widgets.HTML()
        self.prev_button.on_click(lambda _: self.go(-1))
        self.next_button.on_click(lambda _: self.go(+1))
        self.run_all_button.on_click(lambda _: self._run_all())
        self.stage.observe(self._on_stage, names="value")
        self.view.observe(lambda _: self.render(), names="value")
        controls = widgets.HBox([self.prev_button, self.stage, self.next_button,
                                 self.run_all_button, self.status])
        super().__init__([controls, self.view, self.content])
        self.add_class("fx-stepper")
        if not ex.records:
            ex.step()  # something to show: the ingested graph
        self._sync_options(ex.records[-1].name)
        self.render()

    # -- navigation ----------------------------------------------------------------------

    @property
    def current(self) -> str:
        return self.stage.value

    def go(self, delta: int) -> None:
        names = self.ex.stage_names
        i = min(max(names.index(self.current) + delta, 0), len(names) - 1)
        self.select(names[i])

    def select(self, name: str) -> None:
        """Show stage ``name``, running the stages up to it first if needed."""
        if name not in self.ex.stage_names:
            raise KeyError(f"no stage {name!r}; stages are {self.ex.stage_names}")
        error = self._run_to(name)
        if not any(r.name == name for r in self.ex.records):  # it failed: stay where we got to
            name = self.ex.records[-1].name
        self._sync_options(name)
        self.render()
        if error:
            self.content.value = error + self.content.value

    def _run_to(self, name: str) -> str | None:
        """Run the stages up to ``name``; an error comes back as HTML, to be shown, because an
        exception raised in a widget callback only reaches a log nobody reads."""
        if any(r.name == name for r in self.ex.records):
            return None
        self.status.value = f'<span style="color:#777">running up to {esc(name)} …</span>'
        try:
            self.ex[name]
        except Exception as e:
            return wrap(f'<div class="fx-note"><b>{esc(type(e).__name__)}</b><pre>{esc(e)}</pre>'
                        "</div>")
        return None

    def _run_all(self) -> None:
        self.select(self.ex.stage_names[-1])

    def _on_stage(self, change) -> None:
        if not self._syncing and change["new"] is not None:
            self.select(change["new"])

    def _sync_options(self, selected: str) -> None:
        done = {r.name: r for r in self.ex.records}
        options = []
        for i, name in enumerate(self.ex.stage_names):
            rec = done.get(name)
            if rec is None:
                tag = "(not run)"
            elif rec.verification is None:
                tag = ""
            else:
                tag = "✓" if rec.verification.ok else "✗"
            options.append((f"{i + 1}. {name} {tag}".rstrip(), name))
        self._syncing = True
        try:
            self.stage.options = options
            self.stage.value = selected
        finally:
            self._syncing = False
        names = self.ex.stage_names
        self.prev_button.disabled = selected == names[0]
        self.next_button.disabled = selected == names[-1]
        self.run_all_button.disabled = self.ex.done
        self.status.value = f"{len(self.ex.records)} of {len(names)} stages run"

    # -- rendering -----------------------------------------------------------------------

    def render(self) -> None:
        rec = next((r for r in self.ex.records if r.name == self.current), None)
        if rec is None:
            return
        view = VIEW_LABELS[self.view.value]
        if view == "pipeline":  # the overview changes as stages run: never cached
            body = overview_table(self.ex, current=rec.name)
        else:
            if (rec.name, view) not in self._cache:
                self._cache[(rec.name, view)] = view_html(rec, view)
            body = self._cache[(rec.name, view)]
        self.content.value = wrap(header_html(rec) + verification_html(rec) + body)


def _label(view: str) -> str:
    for label, v in VIEW_LABELS.items():
        if v == view.lower() or label == view:
            return label
    raise ValueError(f"unknown view {view!r}; one of {', '.join(VIEW_LABELS)}")
