"""Compatibility matrix: each adapter proven against its host framework's real contract, per environment.

``python -m compat_matrix run [--env NAME]`` builds one virtual environment per ``manifest.toml`` entry,
runs the contract-tagged tests there and writes ``MATRIX.md`` + ``MATRIX.json``.
"""
