"""The hit-rate predictor: index activity, features, the decision-log join, the model.

Importing this package loads no scikit-learn; ``model`` and ``persist`` do.
"""
