# %% [markdown]
# ## References
#
# The prose cites these by author and year; arXiv numbers identify each paper.
#
# **Algorithms**
#
# - *Trust Region Policy Optimization.* Schulman, J., Levine, S., Moritz, P., Jordan, M., Abbeel, P.
#   (2015). ICML. arXiv:1502.05477.
# - *High-Dimensional Continuous Control Using Generalized Advantage Estimation.* Schulman, J.,
#   Moritz, P., Levine, S., Jordan, M., Abbeel, P. (2016). ICLR. arXiv:1506.02438. (GAE, §2.3.)
# - *Proximal Policy Optimization Algorithms.* Schulman, J., Wolski, F., Dhariwal, P., Radford, A.,
#   Klimov, O. (2017). arXiv:1707.06347. (The clipped surrogate, §2.2.)
# - *Approximating KL Divergence.* Schulman, J. (2020). Blog post, joschu.net/blog/kl-approx.html.
#   (The estimators $k_1$, $k_2$, $k_3$ of §2.2, §3.6 and §5.)
# - *Direct Preference Optimization: Your Language Model is Secretly a Reward Model.* Rafailov, R.,
#   et al. (2023). NeurIPS. arXiv:2305.18290. (DPO, §4.4.)
# - *DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models.* Shao, Z.,
#   et al. (2024). arXiv:2402.03300. (GRPO, §4 and §5.)
#
# **RLHF with PPO on language models**
#
# - *Fine-Tuning Language Models from Human Preferences.* Ziegler, D. M., Stiennon, N., Wu, J.,
#   Brown, T. B., Radford, A., Amodei, D., Christiano, P., Irving, G. (2019). arXiv:1909.08593. Code:
#   github.com/openai/lm-human-preferences. (The per-token KL reward and the adaptive controller,
#   §2.)
# - *Learning to Summarize from Human Feedback.* Stiennon, N., et al. (2020). NeurIPS.
#   arXiv:2009.01325.
# - *Training Language Models to Follow Instructions with Human Feedback.* Ouyang, L., et al. (2022).
#   NeurIPS. arXiv:2203.02155. (InstructGPT and PPO-ptx, §5; exercise 4 builds a term of the same shape on SFT data.)
# - *Constitutional AI: Harmlessness from AI Feedback.* Bai, Y., et al. (2022). arXiv:2212.08073.
#   (§5.)
# - *Llama 2: Open Foundation and Fine-Tuned Chat Models.* Touvron, H., et al. (2023).
#   arXiv:2307.09288. (§4.2 and §5.)
# - *The Llama 3 Herd of Models.* Grattafiori, A., et al. (2024). arXiv:2407.21783. (§5.)
#
# **Implementation studies**
#
# - *Implementation Matters in Deep Policy Gradients: A Case Study on PPO and TRPO.* Engstrom, L.,
#   Ilyas, A., Santurkar, S., Tsipras, D., Janoos, F., Rudolph, L., Madry, A. (2020). ICLR.
#   arXiv:2005.12729. (§6, Q2.)
# - *The 37 Implementation Details of Proximal Policy Optimization.* Huang, S., Dossa, R. F. J.,
#   Raffin, A., Kanervisto, A., Wang, W. (2022). ICLR Blog Track.
# - *The N Implementation Details of RLHF with PPO.* Huang, S., Liu, T., von Werra, L. (2023).
#   Hugging Face blog; ICLR 2024 Blog Track. (Adam's $\epsilon$, the zero value head, §5.)
# - *The N+ Implementation Details of RLHF with PPO*, subtitled "A Case Study on TL;DR
#   Summarization". Huang, S., Noukhovitch, M., Hosseini, A., Rasul, K., Wang, W., Tunstall, L.
#   (2024). COLM 2024. arXiv:2403.17031.
#   (Reward whitening, `vf_coef` 0.1 and the production table, §2.3, §4.3 and §5.)
#
# **Libraries**
#
# - *CleanRL: High-quality Single-file Implementations of Deep Reinforcement Learning Algorithms.*
#   Huang, S., et al. (2022). JMLR 23(274). github.com/vwxyzjn/cleanrl.
# - *TRL: Transformers Reinforcement Learning.* von Werra, L., Belkada, Y., Tunstall, L., Beeching, E.,
#   Thrush, T., Lambert, N., Huang, S., Rasul, K., Gallouédec, Q. (2020). github.com/huggingface/trl
#   (title and authors as in its `CITATION.cff`). (Legacy `PPOTrainer` up to 0.11; the rewritten
#   trainer from 0.12, moved to `trl.experimental.ppo` in v0.26 (PR #4482), removed in 1.13.0 by
#   PR #7020; the defaults of §5 are read from 1.12.0's `PPOConfig`, the last release with PPO.)
# - *verl: Volcano Engine Reinforcement Learning for LLMs.* github.com/volcengine/verl; the paper is
#   Sheng, G., et al. (2025). *HybridFlow: A Flexible and Efficient RLHF Framework.* EuroSys.
#   arXiv:2409.19256. (Defaults of §5 read from v0.7.0's
#   `verl/trainer/config/_generated_ppo_trainer.yaml` and `verl/trainer/ppo/core_algos.py`.)
# - *OpenRLHF: An Easy-to-use, Scalable and High-performance RLHF Framework.* Hu, J., et al. (2024).
#   arXiv:2405.11143. github.com/OpenRLHF/OpenRLHF. (Defaults and flags read from v0.11.0:
#   `openrlhf/cli/train_ppo_ray.py`, `openrlhf/models/loss.py`, `openrlhf/trainer/ppo_trainer.py`;
#   one optimiser step per `--train.batch_size` samples by gradient accumulation in
#   `openrlhf/trainer/ray/ppo_actor.py`.)
#
# **Stale rollouts, KL as a loss, long responses** (§2, §4.2, §5, exercise 5)
#
# - *Batch Size-Invariance for Policy Optimization.* Hilton, J., Cobbe, K., Schulman, J. (2022).
#   NeurIPS. arXiv:2110.00641. (Decoupled PPO: proximal and behaviour policies, §4.2 and exercise 5.)
# - *Asynchronous RLHF: Faster and More Efficient Off-Policy RL for Language Models.* Noukhovitch, M.,
#   et al. (2024). arXiv:2410.18252. (§4.2.)
# - *On a Few Pitfalls in KL Divergence Gradient Estimation for RL.* Tang, Y., Munos, R. (2025).
#   arXiv:2506.09477. (KL estimators used as losses, §5 and §6 Q1.)
# - *DAPO: An Open-Source LLM Reinforcement Learning System at Scale.* Yu, Q., et al. (2025).
#   arXiv:2503.14476. (Clip-higher, token-level loss, overlong shaping, no KL term, §5.)
# - *Mastering Complex Control in MOBA Games with Deep Reinforcement Learning.* Ye, D., et al. (2020).
#   AAAI. arXiv:1912.09729. (Dual-clip PPO, §5.)
# - *Understanding R1-Zero-Like Training: A Critical Perspective.* Liu, Z., et al. (2025).
#   arXiv:2503.20783. (Dr. GRPO: biases of per-response averaging and of the group std, §5.)
# - *What's Behind PPO's Collapse in Long-CoT? Value Optimization Holds the Secret.* Yuan, Y., Yue, Y.,
#   Zhu, R., Fan, T., Yan, L. (2025). arXiv:2503.01491. (Value pretraining and decoupled GAE, §5.)
# - *VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks.* Yue, Y., et al.
#   (2025). arXiv:2504.05118. (Length-adaptive GAE on top of value pretraining, §5.)
# - *Group Sequence Policy Optimization.* Zheng, C., et al. (2025). arXiv:2507.18071. (A sequence-level
#   ratio and clip, §5.)
# - *IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner Architectures.*
#   Espeholt, L., et al. (2018). ICML. arXiv:1802.01561. (V-trace: truncated importance weights, §4.2.)
# - *Your Efficient RL Framework Secretly Brings You Off-Policy RL Training.* Yao, F., et al. (2025). Blog post,
#   fengyao.notion.site/off-policy-rl. (The
#   training-inference mismatch and truncated importance sampling, §4.2.)
# - *Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale Thinking Model.* Ling Team
#   (2025). arXiv:2510.18855. (Ring-1T; IcePop's token mask, §4.2.)
#
# **The 2025-26 practice** (fifth edition: §3.8, §4.2, §4.5, §5)
#
# - *AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning.* Fu, W.,
#   et al. (2025). arXiv:2505.24298. (Asynchronous RL with the decoupled objective and a staleness
#   bound, §4.2.)
# - *PipelineRL: Faster On-policy Reinforcement Learning for Long Sequence Generation.* Piché, A., et
#   al. (2025). arXiv:2509.19128. (In-flight weight updates, §4.2.)
# - *Defeating the Training-Inference Mismatch via FP16.* Qi, P., et al. (2025). arXiv:2510.26788.
#   (§4.2's fp16 row.)
# - *Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers.* (2025).
#   arXiv:2510.11370. (Rollout routing replay, §4.2.)
# - Liu et al. (2025). arXiv:2510.01555. (KL estimators in the reward and in the loss, on and off
#   policy; $k_2$ as a loss, §5.)
# - *Preference Fine-Tuning of LLMs Should Leverage Suboptimal, On-Policy Data.* Tajwar, F., et al.
#   (2024). ICML. arXiv:2404.14367. (On-policy pairs for DPO, §4.4.)
# - *REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models.* Hu, J. (2025).
#   arXiv:2501.03262. (Batch-normalised advantages and the group-baseline form, §4.5.)
# - *MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention.* MiniMax (2025).
#   arXiv:2506.13585. (CISPO, §4.5 and §5.)
# - *The Art of Scaling Reinforcement Learning Compute for LLMs.* Khatri, D., et al. (2025).
#   arXiv:2510.13786. (ScaleRL: sigmoidal compute-reward curves, §5.)
# - *DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via Reinforcement Learning.*
#   DeepSeek-AI (2025). arXiv:2501.12948. (GRPO at scale, rule-based rewards, R1-Zero, §5.)
# - *Tülu 3: Pushing Frontiers in Open Language Model Post-Training.* Lambert, N., et al. (2024).
#   arXiv:2411.15124. (RLVR with PPO, §5.)
# - *The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models.* Cui, G., et al.
#   (2025). arXiv:2505.22617. (Entropy collapse, Clip-Cov and KL-Cov, §5.)
# - *ProRL: Prolonged Reinforcement Learning Expands Reasoning Boundaries in Large Language Models.*
#   Liu, M., et al. (2025). arXiv:2505.24864. (KL control with reference resets, §5.)
# - *RL's Razor: Why Online Reinforcement Learning Forgets Less.* Shenfeld, I., Pari, J., Agrawal, P.
#   (2025). arXiv:2509.04259. (Forgetting predicted by the KL moved, §5.)
# - *Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond the Base
#   Model?* Yue, Y., et al. (2025). arXiv:2504.13837. (pass@k of RL-trained and base models, §5.)
# - *WARM: On the Benefits of Weight Averaged Reward Models.* Ramé, A., et al. (2024).
#   arXiv:2401.12187. (§3.8.)
# - *ODIN: Disentangled Reward Mitigates Hacking in RLHF.* Chen, L., et al. (2024). arXiv:2402.07319.
#   (§3.8.)
#
# **Systems** (§4)
#
# - *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models.* Rajbhandari, S., Rasley, J.,
#   Ruwase, O., He, Y. (2020). SC20. arXiv:1910.02054. (Sharding, §4.1.)
# - *DeepSpeed-Chat: Easy, Fast and Affordable RLHF Training of ChatGPT-like Models at All Scales.*
#   Yao, Z., et al. (2023). arXiv:2308.01320. Code: github.com/microsoft/DeepSpeedExamples,
#   `applications/DeepSpeed-Chat/dschat/rlhf/ppo_trainer.py` at commit 3b45859; the batch defaults
#   (16 generated and 16 trained per device, one generation batch, one PPO epoch) in
#   `applications/DeepSpeed-Chat/training/step3_rlhf_finetuning/main.py`. (Defaults and greedy
#   decoding for Llama models, §4.3 and §5.)
# - *Efficient Memory Management for Large Language Model Serving with PagedAttention.* Kwon, W., et
#   al. (2023). SOSP. arXiv:2309.06180. (vLLM, §4.2.)
#
# **Reward models, over-optimisation and critic-free advantages** (§3.7, §3.8, §4.5)
#
# - *Rank Analysis of Incomplete Block Designs: I. The Method of Paired Comparisons.* Bradley, R. A.,
#   Terry, M. E. (1952). Biometrika 39(3/4). (The Bradley-Terry model behind the pairwise loss, §3.7.)
# - *Deep Reinforcement Learning from Human Preferences.* Christiano, P., Leike, J., Brown, T. B.,
#   Martic, M., Legg, S., Amodei, D. (2017). NeurIPS. arXiv:1706.03741. (A reward model fitted to
#   pairwise comparisons, §3.7.)
# - *Scaling Laws for Reward Model Overoptimization.* Gao, L., Schulman, J., Hilton, J. (2023). ICML.
#   arXiv:2210.10760. (Gold and proxy reward against $\sqrt{\mathrm{KL}}$, §3.8.)
# - *A Long Way to Go: Investigating Length Correlations in RLHF.* Singhal, P., Goyal, T., Xu, J.,
#   Durrett, G. (2023). arXiv:2310.03716. (Length as the feature PPO exploits, §3.8.)
# - *Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in
#   LLMs.* Ahmadian, A., Cremer, C., Gallé, M., Fadaee, M., Kreutzer, J., Pietquin, O., Üstün, A.,
#   Hooker, S. (2024). ACL. arXiv:2402.14740. (RLOO, §4.5.)
# - *Is DPO Superior to PPO for LLM Alignment? A Comprehensive Study.* Xu, S., Fu, W., Gao, J., Ye, W.,
#   Liu, W., Mei, Z., Wang, G., Yu, C., Wu, Y. (2024). ICML. arXiv:2404.10719. (Well-tuned PPO against
#   DPO, §4.4 and §4.5.)
# - *Reward Model Ensembles Help Mitigate Overoptimization.* Coste, T., Anwar, U., Kirk, R.,
#   Krueger, D. (2023). ICLR 2024. arXiv:2310.02743. (§4.3, §6 Q6.)
# - *Helping or Herding? Reward Model Ensembles Mitigate but do not Eliminate Reward Hacking.*
#   Eisenstein, J., et al. (2023). arXiv:2312.09244. (§4.3, §6 Q6.)
# - *Theoretical Guarantees on the Best-of-n Alignment Policy.* Beirami, A., et al. (2024).
#   arXiv:2401.01879. (The best-of-$N$ KL bound, §4.4 and §6 Q5.)
#
# **What the fifth edition changed, and where.** For readers of the fourth: §1's table now names
# §3.7-3.8, §4.5 and §5's long-response knobs. §3.6 says why the length rises (the reward favours
# it) instead of calling it a hack. §3.8 reports its summary table in one unit, the equal-KL result
# as measured (the largest $\beta$ slightly ahead at every $\sqrt{\mathrm{KL}}$, within what three
# seeds can separate), what the clean control does and does not show, and WARM and ODIN among the
# remedies. §4.2 adds asynchronous systems (AReaL, PipelineRL), an fp16 row to the mismatch table,
# routing replay, and sources for the README figure and for DPO's on-policy pairs (§4.4). §4.5
# explains the PPO/RLOO/GRPO tie with per-token credit measured during training and a sweep at 8
# samples a step, names the GRPO arm for what it is (the published objective at the chapter's
# settings), traces its KL gap to the group-std division with an ablation arm, and adds REINFORCE++,
# CISPO and dynamic sampling. §5 corrects the reading of the defaults table (two camps on $\lambda$
# and the value clip, three on the reward clip; a row of optimiser steps per rollout batch; why one
# epoch does not switch the clip off), adds $k_2$ as a loss to the KL cell and §6 Q1, the
# verifiable-reward recipes (Tülu 3, DeepSeek-R1), ScaleRL, the entropy mechanism, the case for
# keeping a reference KL (ProRL, RL's Razor, Yue et al.) and VAPO's loss on correct responses, drops
# an unsourced anecdote about a per-rank KL, and draws a plainer lesson from Llama 3.
