"""Tests of one module or job, called in process."""
