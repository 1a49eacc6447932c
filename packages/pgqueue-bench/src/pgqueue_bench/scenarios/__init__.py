"""The benchmark scenarios: one module, or one subpackage with its ``driver`` module, per
``pgqueue bench`` command."""
