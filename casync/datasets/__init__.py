"""Small datasets and models for demos and tests (``casync train``, ``examples/train_digits.py``)."""
