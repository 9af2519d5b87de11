"""PyTorch's compiled CPU path as an artifact of the folder: AOTInductor packages (`vitexport aoti`)."""
