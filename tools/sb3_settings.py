"""Stable-Baselines3 settings equal to a flare2 run's: the SB3 side of tools/bench_peers.py.

    from sb3_settings import sb3_spec
    plan = resolve(["--algo", "ppo", "--env", "CartPole-v1"])        # flare2.commands.train
    spec = sb3_spec("ppo", plan.config, plan.settings, plan.options, budget=100_000)
    spec.describe()   # PPO(n_envs=8, n_steps=32, batch_size=256, ..., learning_rate=linear(0.001 -> 0 at 100000 steps))

One mapping per algorithm SB3 also has (PPO, A2C, DQN, TD3, SAC; APPO is raced
against SB3's PPO with its own settings), from the settings ``flare2 train``
resolved: the algorithm's config, its agents' settings and the run options.
What SB3 spells another way is matched by its equivalent and said in
``equivalents`` (a target blended per vec step rather than per gradient step,
gradient steps per env step as train_freq and gradient_steps); what SB3 cannot
do is said in ``differences``, and a field of the flare2 config that no mapping
here reads is one of them too, so a new setting is never raced silently unlike.

The spec is plain JSON: tools/sb3_train.py (run by the SB3 virtualenv's python)
builds the model from it. Neither module imports SB3 or torch here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

SB3_CLASS = {"ppo": "PPO", "a2c": "A2C", "dqn": "DQN", "td3": "TD3", "sac": "SAC", "appo": "PPO"}
"""The flare2 algorithms raced, and the SB3 class each one is raced against."""


@dataclass
class Sb3Spec:
    """How tools/sb3_train.py builds SB3's side of a row: the class, its keyword arguments and its env."""

    algo: str
    """SB3 class name: PPO, A2C, DQN, TD3 or SAC."""
    n_envs: int
    kwargs: dict[str, Any]
    """Keyword arguments of the SB3 class, JSON values only (the schedules and noise are given apart)."""
    learning_rate: dict[str, float] | None = None
    """A linear schedule ``{"start": lr, "zero_at": f, "steps": n}``: lr falls to 0 at the fraction f of learn()'s
    budget, n env steps (then stays there); None leaves ``kwargs["learning_rate"]``, a constant."""
    action_noise: float | None = None
    """Standard deviation of Gaussian action noise, a fraction of the half action range (SB3 adds it in [-1, 1])."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """gymnasium.make's keyword arguments (max_episode_steps)."""
    normalize_observations: bool = False
    """VecNormalize(norm_obs=True, clip_obs=10), as flare2's --normalize-observations."""
    normalize_rewards: float | None = None
    """VecNormalize(norm_reward=True, gamma=this, clip_reward=10), as flare2's --normalize-rewards; None: off."""
    reward_scale: float | None = None
    reward_clip: float | None = None
    frame_stack: int | None = None
    features_extractor: str | None = None
    """The CNN tools/sb3_train.py puts under SB3's MLPs: ``minatar`` (flare2's MinAtar encoder); None: SB3's own
    (MlpPolicy's flatten)."""
    torch_threads: int = 1
    """torch.set_num_threads of SB3's process: flare2's --torch-threads, which its compute and learner processes take.
    Left at torch's default (one per core) SB3 ran 10 times slower on a busy 2-core machine."""
    equivalents: list[str] = field(default_factory=list)
    """Settings SB3 spells another way, and how they were matched."""
    differences: list[str] = field(default_factory=list)
    """Settings that could not be matched: the two sides race with these apart."""

    def describe(self) -> str:
        """The SB3 call in one line, schedules and wrappers included."""
        parts = [f"n_envs={self.n_envs}"]
        for key, value in self.kwargs.items():
            if key == "learning_rate" and self.learning_rate is not None:
                continue
            parts.append(f"{key}={value!r}")
        if self.learning_rate is not None:
            parts.append(f"learning_rate={_schedule_text(self.learning_rate)}")
        if self.action_noise is not None:
            parts.append(f"action_noise=NormalActionNoise(sigma={self.action_noise:g})")
        wrappers = []
        if self.env_kwargs:
            wrappers.append(f"env_kwargs={self.env_kwargs!r}")
        if self.reward_scale is not None:
            wrappers.append(f"rewards times {self.reward_scale:g}")
        if self.reward_clip is not None:
            wrappers.append(f"rewards clipped to +-{self.reward_clip:g}")
        if self.frame_stack:
            wrappers.append(f"VecFrameStack({self.frame_stack})")
        if self.features_extractor:
            wrappers.append(f"the {self.features_extractor} CNN as the features extractor")
        if self.normalize_observations or self.normalize_rewards is not None:
            rewards = "False" if self.normalize_rewards is None else f"True, gamma={self.normalize_rewards:g}"
            wrappers.append(f"VecNormalize(norm_obs={self.normalize_observations}, norm_reward={rewards})")
        wrappers.append(f"torch.set_num_threads({self.torch_threads})")
        return f"{self.algo}({', '.join(parts)})" + (f" with {'; '.join(wrappers)}" if wrappers else "")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _schedule_text(schedule: Mapping[str, float]) -> str:
    return f"linear({schedule['start']:g} -> 0 over {schedule['steps']:.0f} env steps)"


class _Fields:
    """The fields of a flare2 config or settings dataclass, each marked as read when a mapping takes it.

    What is left unread at the end has no counterpart in the mapping: ``unread`` lists it, so that it is printed
    as a difference rather than raced silently.
    """

    def __init__(self, *configs: Any, image_encoder: str | None = None) -> None:
        self.image_encoder = image_encoder
        """The CNN flare2 gives the env's images (None: vector observations)."""
        self.values: dict[str, Any] = {}
        for config in configs:
            for item in dataclasses.fields(config):
                self.values.setdefault(item.name, getattr(config, item.name))
        self.read: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def take(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        return self.values.get(name, default)

    def unread(self) -> dict[str, Any]:
        return {name: value for name, value in self.values.items() if name not in self.read}


def sb3_spec(
    algo: str, config: Any, settings: Any, options: Mapping[str, Any], *, budget: int, image_encoder: str | None = None
) -> Sb3Spec:
    """SB3's settings for a flare2 run of ``algo`` with this resolved config, agent settings and run options,
    trained for ``budget`` env steps (learn()'s total_timesteps, over which SB3's schedules run).
    ``image_encoder``: the CNN flare2 gives the env's image observations (flare2.zoo.encoders.encoder_kind), None
    for vectors."""
    if algo not in MAPPINGS:
        raise KeyError(f"no SB3 mapping for {algo!r}: the raced algorithms are {', '.join(MAPPINGS)}")
    fields = _Fields(config, settings, image_encoder=image_encoder)
    spec = MAPPINGS[algo](fields, options, budget)
    _env_options(spec, options)
    for name, value in fields.unread().items():
        spec.differences.append(f"flare2's {name}={value!r} has no counterpart in this mapping")
    return spec


def _env_options(spec: Sb3Spec, options: Mapping[str, Any]) -> None:
    """The run options that change what the learner sees: the same wrappers on SB3's envs."""
    if options.get("max_episode_steps"):
        spec.env_kwargs["max_episode_steps"] = options["max_episode_steps"]
    spec.normalize_observations = bool(options.get("normalize_observations"))
    spec.normalize_rewards = options.get("normalize_rewards")
    spec.reward_scale = options.get("scale_rewards")
    spec.reward_clip = options.get("clip_rewards")
    spec.torch_threads = int(options.get("torch_threads") or 1)


def _env_count(options: Mapping[str, Any]) -> int:
    return int(options["num_agents"]) * int(options["envs_per_agent"])


def _learning_rate(spec: Sb3Spec, lr: float, anneal_steps: int | None, budget: int) -> None:
    """A constant lr, or one falling linearly to 0 over anneal_steps env steps (SB3: a schedule over learn())."""
    spec.kwargs["learning_rate"] = lr
    if anneal_steps is not None:
        spec.learning_rate = {"start": lr, "zero_at": anneal_steps / budget, "steps": anneal_steps}
        spec.equivalents.append(
            f"the learning rate falls linearly from {lr:g} to 0 over {anneal_steps} env steps on both sides "
            "(SB3: a schedule over learn())"
        )


# ---- on-policy: PPO, APPO, A2C ----------------------------------------------------------------------------------


def _actor_critic(fields: _Fields, options: Mapping[str, Any], spec: Sb3Spec, *, learn_ahead: int = 1) -> None:
    """What PPO and A2C share: the envs, the rollout length, the network and the loss weights."""
    hidden = list(fields.take("hidden"))
    policy_kwargs: dict[str, Any] = {"net_arch": {"pi": hidden, "vf": hidden}}
    if fields.take("activation", "tanh") != "tanh":
        policy_kwargs["activation_fn"] = fields.take("activation")  # tools/sb3_train.py makes it torch's module
    if fields.take("critic", "own") != "own":
        spec.differences.append("flare2's centralised critic (--critic state) has no SB3 counterpart")
    spec.kwargs.update(
        n_steps=fields.take("sample_interval"),
        gamma=fields.take("gamma"),
        ent_coef=fields.take("entropy_coef"),
        vf_coef=fields.take("value_coef"),
        max_grad_norm=fields.take("max_grad_norm"),
        # Separate MLPs for the policy and the value, orthogonal init: flare2's ActorCritic and SB3's default (tanh
        # for both unless --activation says otherwise).
        policy_kwargs=policy_kwargs,
    )
    _observations(fields, spec)
    if fields.take("double_buffer", False):
        spec.differences.append(
            "flare2 plays its envs in two halves that alternate (--double-buffer); SB3 steps them all at once"
        )
    if fields.take("complete_episodes", False):
        spec.differences.append("flare2 sends whole episodes (complete_episodes); SB3 cuts rollouts of n_steps")
    if options.get("serial"):
        spec.equivalents.append(
            "flare2 runs in one process (--serial) and learns between predictions: each rollout is played by the "
            "weights of the update before it, as SB3's (lag about 0)"
        )
    elif options.get("learner") == "inline":
        spec.equivalents.append(
            "flare2 learns between predictions (--learner inline): each rollout is played by the "
            "weights of the update before it, as SB3's (lag about 0)"
        )
    else:
        spec.differences.append(
            f"flare2's agents act on while learn() runs in its learner process (learn_ahead {learn_ahead}): a batch "
            f"may begin with steps of weights up to {learn_ahead} update(s) old; SB3 waits for each update"
        )


def _observations(fields: _Fields, spec: Sb3Spec) -> None:
    """The frame stack and the encoder: flare2's ``auto`` encoder of a vector is its MLP, SB3's MlpPolicy."""
    frames = fields.take("frames", 1)
    if frames > 1:
        spec.frame_stack = frames
        spec.equivalents.append(f"flare2's frame-stack view of {frames} observations: SB3's VecFrameStack({frames})")
    encoder = fields.take("encoder", "auto")
    if fields.image_encoder == "minatar":
        spec.features_extractor = "minatar"
        spec.equivalents.append(
            "flare2's MinAtar CNN (a 3x3 convolution of 16 channels, 128 features) under the MLPs: the same "
            "network as SB3's features extractor"
        )
    elif fields.image_encoder == "flat":
        spec.equivalents.append("flare2's --encoder flat: the pixels flattened into the MLPs, as SB3's MlpPolicy")
    elif fields.image_encoder is not None:
        spec.differences.append(f"flare2's {fields.image_encoder} CNN; SB3's MlpPolicy flattens the pixels")
    elif encoder != "auto":
        spec.differences.append(f"flare2's --encoder {encoder} (images only); SB3's policy picks its own CNN")


def _ppo(fields: _Fields, options: Mapping[str, Any], budget: int, *, learn_ahead: int = 1) -> Sb3Spec:
    spec = Sb3Spec("PPO", _env_count(options), {})
    _actor_critic(fields, options, spec, learn_ahead=learn_ahead)
    # The decoupled objective's truncation: it acts only on steps played by older weights (lag), said above.
    fields.take("rho_bar")
    spec.kwargs.update(
        batch_size=fields.take("minibatch_size"),
        n_epochs=fields.take("epochs"),
        gae_lambda=fields.take("gae_lambda"),
        clip_range=fields.take("clip"),
        normalize_advantage=True,  # flare2 standardises the advantages of each minibatch, as SB3 does
    )
    _learning_rate(spec, fields.take("lr"), fields.take("anneal_steps"), budget)
    return spec


def _appo(fields: _Fields, options: Mapping[str, Any], budget: int) -> Sb3Spec:
    spec = _ppo(fields, options, budget, learn_ahead=2)  # flare2.zoo.appo.APPO.learn_ahead
    rho_bar, c_bar = fields.take("rho_bar"), fields.take("c_bar")
    spec.differences.append(
        f"APPO against SB3's PPO: V-trace advantages and targets (rho_bar={rho_bar:g}, c_bar={c_bar:g}, gae_lambda "
        "as its trace decay) in place of GAE"
    )
    return spec


def _a2c(fields: _Fields, options: Mapping[str, Any], budget: int) -> Sb3Spec:
    spec = Sb3Spec("A2C", _env_count(options), {})
    _actor_critic(fields, options, spec)
    # flare2's n-step returns are GAE with lambda 1.
    spec.kwargs.update(gae_lambda=1.0, normalize_advantage=fields.take("normalize_advantages"))
    optimizer = fields.take("optimizer")
    spec.kwargs["use_rms_prop"] = optimizer == "rmsprop"
    if optimizer == "rmsprop":
        spec.kwargs["rms_prop_eps"] = 1e-5  # flare2's RMSprop: alpha 0.99, eps 1e-5; SB3's A2C: the same
    else:
        spec.differences.append(f"optimizer {optimizer}: flare2's Adam has eps 1e-8, SB3's A2C Adam 1e-5")
    _learning_rate(spec, fields.take("lr"), fields.take("anneal_steps"), budget)
    return spec


# ---- off-policy: DQN, TD3, SAC -------------------------------------------------------------------------------------


def _replay(fields: _Fields, options: Mapping[str, Any], spec: Sb3Spec) -> Fraction:
    """The buffer, warm-up, minibatch and how often to train; returns SB3's gradient steps per vec step.

    flare2's agents each send a learn request of ``batch_size`` samples per ``sample_interval`` env steps
    (``warmup`` stored over all agents first), and learn() takes one gradient step per ``minibatch_size`` of them.
    SB3 trains every ``train_freq`` vec steps (of all ``n_envs``), ``gradient_steps`` of ``batch_size`` each: they
    are chosen so that both take as many gradient steps per env step.
    """
    n_envs, agents = spec.n_envs, int(options["num_agents"])
    batch, interval = fields.take("batch_size"), fields.take("sample_interval")
    minibatch = fields.take("minibatch_size")
    steps_per_request = math.ceil(batch / minibatch)
    if batch % minibatch:
        spec.differences.append(
            f"flare2's learn requests of {batch} samples make {steps_per_request} gradient steps, the last of "
            f"{batch % minibatch} samples; SB3's are all of {minibatch}"
        )
    per_vec_step = Fraction(n_envs * steps_per_request, interval)
    spec.kwargs.update(
        buffer_size=fields.take("buffer"),
        learning_starts=fields.take("warmup"),
        batch_size=minibatch,
        gamma=fields.take("gamma"),
        train_freq=per_vec_step.denominator,
        gradient_steps=per_vec_step.numerator,
        n_steps=fields.take("n_step"),
    )
    spec.equivalents.append(
        f"{float(per_vec_step / n_envs):g} gradient step(s) of {minibatch} per env step on both sides (flare2: a learn "
        f"request of {batch} per {interval} env steps of each agent; SB3: train_freq={per_vec_step.denominator} "
        f"vec steps of {n_envs} envs, gradient_steps={per_vec_step.numerator})"
    )
    if agents > 1:
        spec.differences.append(
            f"flare2's {agents} agents each keep 1/{agents} of the buffer and sample their requests from it; "
            "SB3 samples from the whole buffer"
        )
    return per_vec_step


def _dqn(fields: _Fields, options: Mapping[str, Any], budget: int) -> Sb3Spec:
    spec = Sb3Spec("DQN", _env_count(options), {})
    per_vec_step = _replay(fields, options, spec)
    start, end, steps = fields.take("epsilon_start"), fields.take("epsilon_end"), fields.take("exploration_steps")
    spec.kwargs.update(
        exploration_initial_eps=start,
        exploration_final_eps=end,
        exploration_fraction=steps / budget,
        max_grad_norm=fields.take("max_grad_norm"),
        policy_kwargs={"net_arch": list(fields.take("hidden"))},  # ReLU on both sides
    )
    _observations(fields, spec)
    spec.equivalents.append(f"epsilon falls from {start:g} to {end:g} over {steps} env steps on both sides")
    _learning_rate(spec, fields.take("lr"), fields.take("anneal_steps"), budget)
    # flare2 blends tau into the target after every target_update_every gradient steps; SB3's DQN after every
    # target_update_interval env steps (vec steps of n_envs). The same decay per env step: blend at each vec step
    # with tau compounded over the refreshes flare2 makes meanwhile, or less often with tau as it is.
    tau, every = fields.take("target_tau"), fields.take("target_update_every")
    refreshes = float(per_vec_step) / every
    if refreshes >= 1:
        sb3_tau, interval = 1 - (1 - tau) ** refreshes, spec.n_envs
    else:
        sb3_tau, interval = tau, round(spec.n_envs / refreshes)
    spec.kwargs.update(tau=round(sb3_tau, 6), target_update_interval=interval)
    spec.equivalents.append(
        f"target network: flare2 blends tau={tau:g} after every {every} gradient step(s); SB3 blends "
        f"tau={sb3_tau:.4g} every {interval} env steps, the same decay per env step"
    )
    if spec.n_envs > 1:
        spec.differences.append(
            f"SB3's DQN draws one epsilon coin per step for all its {spec.n_envs} envs (all explore or none); "
            "flare2 one per env"
        )
    if fields.take("double_q"):
        spec.differences.append("flare2 takes double-Q targets (double_q); SB3's DQN has none (max of the target net)")
    warmup = spec.kwargs["learning_starts"]
    if warmup:
        epsilon = start + min(1.0, warmup / steps) * (end - start)
        spec.differences.append(
            f"SB3 acts uniformly at random for its first {warmup} steps (learning_starts); flare2 follows its epsilon "
            f"schedule from the start ({epsilon:.2f} by then)"
        )
    return spec


def _continuous_replay(fields: _Fields, spec: Sb3Spec, *, one_lr: str) -> None:
    """What TD3 and SAC share: tau, the uniform actions of the warm-up, no gradient clipping."""
    spec.kwargs["tau"] = fields.take("tau")
    warmup = spec.kwargs["learning_starts"]
    random_steps = fields.take("random_steps", warmup)
    if random_steps != warmup:
        spec.differences.append(
            f"flare2 acts uniformly for {random_steps} steps; SB3 for its learning_starts ({warmup})"
        )
    if fields.take("max_grad_norm") is not None:
        spec.differences.append(
            f"flare2 clips gradients to {fields.values['max_grad_norm']:g}; SB3's {spec.algo} does not"
        )
    # SAC has one learning rate; TD3 one for the actor and one for the critics, of which SB3 takes the actor's.
    lrs = {name: fields.take(name) for name in ("actor_lr", "critic_lr") if name in fields}
    lr = fields.take("lr") if "lr" in fields else lrs["actor_lr"]
    spec.kwargs["learning_rate"] = lr
    apart = {name: value for name, value in lrs.items() if value != lr}
    if apart:
        spec.differences.append(
            f"SB3's {spec.algo} takes one learning rate ({one_lr}): {lr:g} for all, where flare2 has "
            + ", ".join(f"{name}={value:g}" for name, value in apart.items())
        )


def _td3(fields: _Fields, options: Mapping[str, Any], budget: int) -> Sb3Spec:
    spec = Sb3Spec("TD3", _env_count(options), {})
    _replay(fields, options, spec)
    _continuous_replay(fields, spec, one_lr="actor and critics")
    spec.kwargs.update(
        policy_delay=fields.take("policy_delay"),
        # Both add the noise in units of the half action range: SB3 in its actions scaled to [-1, 1].
        target_policy_noise=fields.take("policy_noise"),
        target_noise_clip=fields.take("noise_clip"),
        policy_kwargs={"net_arch": list(fields.take("hidden"))},  # the actor's and each critic's, ReLU on both sides
    )
    spec.action_noise = fields.take("exploration_noise")
    return spec


def _sac(fields: _Fields, options: Mapping[str, Any], budget: int) -> Sb3Spec:
    spec = Sb3Spec("SAC", _env_count(options), {})
    _replay(fields, options, spec)
    _continuous_replay(fields, spec, one_lr="actor, critics and entropy coefficient")
    spec.kwargs["policy_kwargs"] = {"net_arch": list(fields.take("hidden"))}
    spec.kwargs["ent_coef"] = _entropy_coef(fields)
    target = fields.take("target_entropy")
    # None is minus the action dimensions on both sides (SB3's "auto").
    spec.kwargs["target_entropy"] = "auto" if target is None else target
    # flare2's SAC moves its targets after every gradient step, as SB3's with target_update_interval=1.
    spec.kwargs["target_update_interval"] = 1
    return spec


def _entropy_coef(fields: _Fields) -> str | float:
    """SB3's ent_coef: ``"auto"`` (learned from 1.0), ``"auto_X"`` (learned from X) or a fixed float."""
    fixed, initial = fields.take("fixed_alpha"), fields.take("initial_alpha")
    if fixed is not None:
        return float(fixed)
    return "auto" if initial == 1.0 else f"auto_{initial:g}"


MAPPINGS: dict[str, Callable[[_Fields, Mapping[str, Any], int], Sb3Spec]] = {
    "ppo": _ppo,
    "appo": _appo,
    "a2c": _a2c,
    "dqn": _dqn,
    "td3": _td3,
    "sac": _sac,
}
"""The mapping of each raced flare2 algorithm (the keys of SB3_CLASS)."""
