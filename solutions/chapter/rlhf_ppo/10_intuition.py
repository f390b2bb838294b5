# %% [markdown]
# ## 1. Intuition: one response, followed through the reward
#
# In RLHF the language model is the *policy*. Every generated token is an **action** $a_t$; the
# **state** $s_t$ is the prompt plus everything generated so far; one response is one **episode**.
# A reward model reads the finished response and returns a single number $r_\phi(x, y)$. On top of
# that, each token pays (or earns back) a small fee for drifting away from a frozen **reference**
# model, usually the supervised fine-tuned model we started from.
#
# Here is one response of four tokens, the last being `<|end|>`. The policy and the reference
# assigned these log-probabilities to the tokens that were actually sampled; the reward model gave
# the whole response 1.5, and the KL coefficient is $\beta = 0.1$. The cell computes the per-token
# reward $R_t = -\beta(\log\pi_\theta - \log\pi_{\text{ref}}) + \mathbb 1[t = T]\, r_\phi$.

# %% tags=["nbval-check-output"]
example = dict(
    logp_policy=torch.tensor([-1.0, -0.5, -2.0, -0.1]),
    logp_ref=torch.tensor([-1.2, -0.5, -1.0, -0.1]),
    score=1.5,
    beta=0.1,
)
kl_term = -example["beta"] * (example["logp_policy"] - example["logp_ref"])  # (4,)
score_term = torch.tensor(
    [0.0, 0.0, 0.0, example["score"]]
)  # the score arrives on the final token only
R = kl_term + score_term
rows = [
    f"| {t + 1} | {lp:+.1f} | {lr:+.1f} | {k:+.2f} | {s:.1f} | **{r:+.2f}** |"
    for t, (lp, lr, k, s, r) in enumerate(
        zip(example["logp_policy"], example["logp_ref"], kl_term, score_term, R, strict=True)
    )
]
display(
    Markdown(
        "\n".join(
            [
                "| $t$ | $\\log\\pi_\\theta$ | $\\log\\pi_{\\text{ref}}$ | KL term | score | $R_t$ |",
                "|---|---|---|---|---|---|",
                *rows,
            ]
        )
    )
)
print(f"return of the episode: sum R_t = {float(R.sum()):.2f}")

# %% [markdown]
# Read the table row by row. The first token is *more* likely under the policy than under the
# reference, so it pays a fee; the third is *less* likely, so the estimator hands back a small
# refund. A single-sample estimate of the KL can be negative on individual tokens; only its
# expectation under the policy is guaranteed non-negative (a finite batch's mean can dip below zero). The 1.5 shows up only on
# the last token: deciding how much of it tokens 1–3 deserve is the job of the **critic** $V(s_t)$,
# which predicts the reward still to come from each prefix, and of **GAE**, which turns "what
# happened minus what was predicted" into a per-token advantage.
#
# The update then asks, token by token, how much more likely the current policy has made that
# token than the policy that sampled it (the ratio $r_t$), and multiplies by the advantage. Once a
# token with positive advantage has had its probability pushed up by more than a factor
# $1 + \epsilon$, PPO's clip stops pushing it for this batch.
#
# One iteration of the whole loop, with the four models involved:

# %% demo=true
show(
    draw_pipeline(),
    alt="Diagram of one PPO-RLHF iteration. Prompts go to the trained policy, which samples responses; the frozen "
    "reward model scores them, the frozen reference gives per-token log-probs for the KL fee, and the trained critic "
    "gives a value per token. Score and KL fee form the shaped reward, GAE turns rewards and values into advantages "
    "and returns, and the clipped PPO update sends new weights back to the policy and the critic.",
)
