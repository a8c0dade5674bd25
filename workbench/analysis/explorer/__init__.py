"""The app's headless side: read-only views of a comparison, their dataclasses, colourings,
the logits strip, one pair's tensor diff, the ranks of a multi-rank compare."""
