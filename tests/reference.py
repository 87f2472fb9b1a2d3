"""The plain numpy reference of the tests: ``attnflow.testing._reference`` (the numpy the
public conformance kit holds models against), re-exported here under its old name."""

from attnflow.testing._reference import *  # noqa: F403
from attnflow.testing._reference import ADAPTIVE_POLY, elu1  # noqa: F401
