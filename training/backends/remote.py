"""dstack and Modal, until the remote-compute issue gives them their SDK code.

They are registered so the API accepts `compute.backend: dstack | modal` and pre-start validation
says plainly that the project has not configured them (422), rather than failing later.
"""
from __future__ import annotations

from django.conf import settings

from studio.errors import Finding
from training.backends.base import Backend, BackendError, JobSpec, PollResult


class _UnconfiguredRemote(Backend):
    label = ""

    def check(self, project, compute: dict) -> list[Finding]:
        return [Finding("compute.backend", f"{self.label} is not configured for this project: use backend local, or ask an owner to connect {self.label}")]

    def image_has(self, module: str) -> bool:
        return module in settings.STUDIO_IMAGE_PACKAGES

    def submit(self, job: JobSpec) -> str:
        raise BackendError(f"{self.label} is not configured for this project")

    def poll(self, run) -> PollResult:
        return PollResult("gone", "provisioning_error", f"{self.label} is not configured")

    def stop(self, run_id: int, attempt: int, job_id: str) -> None:
        return None


class DstackBackend(_UnconfiguredRemote):
    name = "dstack"
    label = "dstack"


class ModalBackend(_UnconfiguredRemote):
    name = "modal"
    label = "Modal"
