"""An endpoint a job hosts: the HTTP server over a backend, and the episodes its clients leave for
training. Ray-free, so that every driver hosts the same one: `actors.endpoint.Endpoint` over the Ray
fleet (in an actor of its own, the backend routing to instances), `rlsched run --local` over the
loop's own engine (`rlsched.rl.local_endpoint`).

What a job asks of it, each episode handed out once:
- `to_judge`: episodes ended with a reference and no reward, for the job's verifier;
- `judged`: the verifier's reward for one of them;
- `take_ready`: the episodes ended and rewarded, for an iteration's batch;
- `checkpointed` / `restore`: where a journal keeps episodes across a crash of the job, which of
  them a checkpoint committed and which come back when iterations run again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlsched.config import EndpointConfig
from rlsched.model.checkpoint import load_prompting
from rlsched.serve.backend import Backend
from rlsched.serve.episodes import Episode, EpisodeStore
from rlsched.serve.run import Served
from rlsched.serve.server import Running, start, with_chat_template
from rlsched.store.episode_journal import EpisodeJournal
from verifiers.protocol import UNIT_REWARDS, RewardRange


@dataclass(frozen=True)
class Judgeable:
    """An episode's final answer for the job's verifier."""

    episode_id: str
    text: str
    version: int
    reference: str
    token_ids: tuple[int, ...]


class HostedEndpoint:
    """The server over `backend`, its episodes kept for the job (see the module's docstring)."""

    def __init__(
        self,
        backend: Backend,
        checkpoint: Path,
        cfg: EndpointConfig,
        *,
        template: str | None = None,
        chat_template: str | None = None,
        model_name: str | None = None,
        journal: str | None = None,
        resume_after: int | None = None,
        rewards: RewardRange = UNIT_REWARDS,
        reference_refusal: str | None = None,
    ) -> None:
        """`journal`: a SQLite file that keeps the episodes across a crash of the job (a new run
        empties it; `resume_after` takes back those the checkpoint of that iteration did not hold)."""
        tokenizer, prompts = load_prompting(checkpoint, template)
        prompts = with_chat_template(tokenizer, prompts, Path(chat_template) if chat_template else None)
        served = Served(backend, tokenizer, prompts, model_name or cfg.model_name or checkpoint.name)
        served.reference_refusal = reference_refusal
        served.episodes = EpisodeStore(cfg.reward_timeout_s, rewards=rewards)
        if journal is not None:
            kept = EpisodeJournal(Path(journal))
            if resume_after is None:
                kept.reset()  # a new run
            served.episodes = EpisodeStore(cfg.reward_timeout_s, journal=kept, rewards=rewards)
            if resume_after is not None:
                served.episodes.restore(resume_after)
        self.running: Running = start(served, cfg)

    @property
    def store(self) -> EpisodeStore:
        return self.running.served.episodes

    def address(self) -> tuple[str, int, str, int]:
        """Where it listens, the model's name and its context length."""
        served = self.running.served
        return self.running.host, self.running.port, served.model_name, served.backend.context_length

    def episodes(self) -> list[Episode]:
        """Every captured episode, as it stands (ready or not)."""
        return self.store.all()

    def to_judge(self) -> list[Judgeable]:
        """Ended episodes that carry a reference and await their reward, each handed out once: the
        job's verifier judges their final answer (the last turn's text)."""
        tokenizer = self.running.served.tokenizer
        return [
            Judgeable(e.id, tokenizer.decode(list(e.turns[-1].token_ids)), e.turns[-1].weight_version,
                      e.reference or "", e.turns[-1].token_ids)
            for e in self.store.to_judge()
        ]  # fmt: skip

    def judged(self, episode_id: str, reward: float) -> None:
        """The verifier's reward for an episode handed out by `to_judge`."""
        self.store.reward(episode_id, reward, judged=True)

    def take_ready(self, iteration: int = 0) -> list[Episode]:
        """The episodes ended and rewarded, each handed out once: iteration `iteration`'s batch."""
        return self.store.take([e.id for e in self.store.ready()], iteration)

    def checkpointed(self, iteration: int) -> None:
        """A checkpoint holds the iterations up to `iteration`: the journal lets their episodes go."""
        self.store.checkpointed(iteration)

    def restore(self, after: int) -> int:
        """The training group was rebuilt from the checkpoint of `after`: the episodes later iterations
        took are back, to be taken again. How many."""
        return self.store.restore(after)

    def stop(self) -> None:
        self.running.stop()
