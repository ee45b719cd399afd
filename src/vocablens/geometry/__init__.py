"""Layer 3: geometry of the embedding and the head — cosine neighbours, PCA, tied-weight checks."""

from vocablens.geometry.tying import TieCheck, tie_check  # noqa: F401
from vocablens.geometry.embedding import DEFAULT_WORD_GROUPS, NeighborList, Neighbors, PCA3D, TokenNeighbors, WordPCA, cosine_neighbors, nearest_neighbors, pca_3d, word_pca  # noqa: F401
