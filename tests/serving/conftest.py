from tests.engine.conftest import torch_one_thread  # noqa: F401 - fixture
