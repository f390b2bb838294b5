import torch

# The toy's tensors are tiny: intra-op threads only contend with each other (10x slower under load).
torch.set_num_threads(1)
