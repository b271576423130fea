"""What a worker declares of its model (`build.model_info`): the Matryoshka sizes only when
the model says so."""

from __future__ import annotations

from inferq.shared.settings import Settings
from inferq.worker.build import model_info
from inferq.worker.models.echo import EchoModel
from tests.fixtures.models import Boxes, MatryoshkaEcho


def test_only_a_declaring_model_gets_sizes() -> None:
    settings = Settings(_env_file=None)
    assert model_info(EchoModel(), "echo", settings, "echo").matryoshka_dims == ()
    assert model_info(Boxes(), "boxes", settings, "").matryoshka_dims == ()  # no attribute at all
    nested = model_info(MatryoshkaEcho(), "nested", settings, "echo")
    assert nested.matryoshka_dims == (2, 4)
