"""The acting pipeline: what goes from Gymnasium envs to a CT's predict requests and back. Imports no torch.

Every flare2 path that plays a Gymnasium env with a CT goes through an
``Acting``, one per group of envs asked in one request: GymAgent's training
envs and its evaluation env, ``flare2 eval`` (which plays a GymAgent) and
``flare2.load_policy`` (which the user steps one observation at a time). So a
trained policy sees exactly what its agents saw. At each step, in order:

1. the envs' observations become rows in the spec dtypes (``ObservationRows``);
2. the data transforms work on them and on the rewards (``Transforms``:
   normalised observations, scaled or clipped rewards), counted into the
   run's statistics only for training envs;
3. the trajectory views are built from them (``ViewRows``: frame stacks,
   previous actions and rewards);
4. the model's states are carried from one step's reply to the next request,
   and start from zeros with each episode;
5. the reply's actions are split per env, Box actions clipped to the space
   (the action the CT chose is the one stored).

Used like this for ``count`` envs::

    acting.start([env.reset()[0] for env in envs])
    while True:
        inputs, request, states = acting.request()   # observations as stored; inputs with views as sent
        actions, next_states = ...ask the CT...
        per_env = acting.env_actions(actions)
        next_rows = acting.next_rows()                # fill with each env's observation after its step
        next_inputs = acting.stepped(next_rows, rewards, actions, next_states)
        acting.restart(ended, [envs[i].reset()[0] for i in ended])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.spaces import ACTION_KEY, ObservationRows, env_actions, regrouped_rows
from flare2.core.specs import CTSpecs
from flare2.core.transforms import Transforms
from flare2.core.views import ViewRows

Arrays = dict[str, Any]


class Acting:
    """The acting pipeline of ``count`` envs and one CT (see the module docstring).

    ``transforms`` is bound already (``Agent.bind_transforms``) and may be shared by several groups of one agent;
    ``training`` says whether these envs' observations count into the run's statistics.
    """

    def __init__(
        self,
        *,
        specs: CTSpecs,
        observation_space: gym.Space,
        action_space: gym.Space,
        transforms: Transforms,
        count: int,
        training: bool = True,
    ) -> None:
        self.specs, self.transforms, self.count, self.training = specs, transforms, count, training
        self.reward_dtype = specs.rewards["reward"].dtype
        self.obs = ObservationRows(specs.acting_inputs, count, keyed=isinstance(observation_space, gym.spaces.Dict))
        self.views = ViewRows(specs, count)
        self.states: Arrays = self._zero_states()
        self.reward_states = transforms.reward_states(count)
        self._action_keys = list(action_space.spaces) if isinstance(action_space, gym.spaces.Dict) else None
        self._clip = (action_space.low, action_space.high) if isinstance(action_space, gym.spaces.Box) else None

    def _zero_states(self) -> Arrays:
        return {name: spec.zeros(self.count) for name, spec in self.specs.states.items()}

    def start(self, observations: Sequence[Any] | np.ndarray) -> None:
        """Every env starts an episode from its observation, as ``reset()`` gave it."""
        self.obs = self.obs.fresh()  # the rows of the last step may be kept by a helper, as a final observation
        for index, observation in enumerate(observations):
            self.obs.set(index, observation)
        inputs: Arrays = self.obs.arrays()
        if self.transforms.observing:
            self.transforms.observations(inputs, count=self.training)
        if self.views:
            self.views.start_all(inputs)
        self.states = self._zero_states()

    def request(self) -> tuple[Arrays, Arrays, Arrays]:
        """This step's observations as they are stored, the inputs to send (with the views), and the states."""
        inputs: Arrays = self.obs.arrays()
        if not self.views:
            return inputs, inputs, self.states
        # Stored steps hold no views: the helper assembles them again for learning. Each row's observation went
        # into the views as it became the row's (``start``, ``stepped``, ``restart``, ``regroup``): the request
        # names those frames, which a local compute process reads in place.
        return inputs, {**inputs, **self.views.newest_inputs(), **self.views.current()}, self.states

    def env_actions(self, actions: Arrays) -> Sequence[Any] | np.ndarray:
        """Each env's action from the rows of a reply, as the env takes it."""
        if self._clip is not None:
            actions = {ACTION_KEY: np.clip(actions[ACTION_KEY], *self._clip)}
        return env_actions(actions, self._action_keys, self.count)

    def next_rows(self) -> ObservationRows:
        """New rows for the observations after the envs' step (fresh every step: a helper keeps what it is given)."""
        return self.obs.fresh()

    def stepped(self, next_rows: ObservationRows, rewards: np.ndarray, actions: Arrays, next_states: Arrays) -> Arrays:
        """The envs stepped with ``actions`` (as the CT returned them) to ``next_rows``, earning ``rewards`` (in the
        reward spec's dtype, transformed here in place); returns the next inputs (transformed)."""
        next_inputs: Arrays = next_rows.arrays()
        if self.transforms.observing:
            self.transforms.observations(next_inputs, count=self.training)
        self.transforms.rewards(rewards, self.reward_states, count=self.training)
        if self.views:
            self.views.advance(next_inputs, actions, {"reward": rewards})
        self.obs, self.states = next_rows, next_states
        return next_inputs

    def regroup(self, kept: np.ndarray, observations: Sequence[Any]) -> None:
        """The rows change (agents of multi-agent envs leave and join): rows ``kept`` go on as they were, in that
        order, and one row per observation in ``observations`` follows, starting an episode from it."""
        added = len(observations)
        self.count = len(kept) + added
        self.obs = self.obs.regrouped(kept, added)
        self.states = {key: regrouped_rows(value, kept, added) for key, value in self.states.items()}
        self.reward_states = [
            regrouped_rows(state, kept, added) if isinstance(state, np.ndarray) else state
            for state in self.reward_states
        ]
        if self.views:
            self.views.regroup(kept, added)
        if added:
            self.restart(np.arange(len(kept), self.count), observations)

    def restart(self, ended: np.ndarray, observations: Sequence[Any]) -> None:
        """Envs ``ended`` start their next episode from ``observations`` (one each, as ``reset()`` gave them).

        The rows ``stepped`` returned keep the final observations: the next request starts from copies.
        """
        self.transforms.episodes_ended(self.reward_states, ended)
        self.obs = self.obs.copy()
        self.states = {key: value.copy() for key, value in self.states.items()}
        for index, observation in zip(ended, observations):
            self.obs.set(index, observation)
            for value in self.states.values():
                value[index] = 0
        if self.transforms.observing:
            inputs: Arrays = self.obs.arrays()
            self.transforms.observations(inputs, ended, count=self.training)
        if self.views:
            for index in ended:
                self.views.start(index, self.obs.row(index))
