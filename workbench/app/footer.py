"""The footer of every screen: the keys that fit, whole; help and quit always among them."""

from __future__ import annotations

from textual import events
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

# kept when the terminal is too narrow for every key: the way to the rest (help, palette) and out
PINNED = frozenset({"help", "quit"})
COMPACT_BELOW = 120  # columns under which keys are drawn without padding, so that more of them fit


class KeysFooter(Footer):
    """Textual's footer, except that a key that does not fit is left out instead of shown cut in half, and that
    keys are drawn compact on a narrow terminal, or wherever every key fits only compact."""

    _composed_for: tuple[object, ...] | None = None  # the bindings the keys were last composed from

    def _bindings_shown(self) -> tuple[object, ...]:
        """What `compose` draws the keys from: the screen's bindings, once they are ready."""
        if not self._bindings_ready:
            return ()
        return tuple(
            (b.key, b.action, b.description, b.show, enabled, tooltip)
            for _node, b, enabled, tooltip in self.screen.active_bindings.values()
        )

    async def recompose(self) -> None:
        # the screen publishes "bindings updated" on every focus change; building the keys again when they are the
        # same was most of the footer's cost at the first paint (every key restyled, twice)
        if not self.is_attached or self._pruning:  # as Textual's recompose: a footer being removed has no screen
            return
        shown = self._bindings_shown()
        if shown == self._composed_for:
            return
        self._composed_for = shown
        await super().recompose()
        self.call_after_refresh(self._fit)

    def on_resize(self, event: events.Resize) -> None:
        self.compact = event.size.width < COMPACT_BELOW
        for key in self.query_children(FooterKey):
            key.display = True
        self.call_after_refresh(self._fit)

    @staticmethod
    def _width(key: FooterKey) -> int:
        # from the text, not the laid-out size: a key scrolled out of the footer's view has no size yet
        return key.render().cell_len + key.styles.margin.width

    def _fit(self) -> None:
        keys = list(self.query_children(FooterKey))
        palette = [k for k in keys if k.has_class("-command-palette")]
        optional = [k for k in keys if k not in palette and k.action.rsplit(".", 1)[-1] not in PINNED]
        room = self.size.width - sum(self._width(k) for k in palette)
        used = sum(self._width(k) for k in keys if k not in palette)
        if used > room and not self.compact:  # compact first (no padding), then leave keys out
            self.compact = True
            self.call_after_refresh(self._fit)
            return
        for key in reversed(optional):
            if used <= room:
                break
            used -= self._width(key)
            key.display = False
