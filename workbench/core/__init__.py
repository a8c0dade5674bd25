"""Facts every layer shares, with no dependency on any other part of `wb`: metric vocabulary, file names."""
