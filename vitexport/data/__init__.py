"""Images in: what preprocessing is (`preprocess.Preprocess`), listing and decoding image folders and turning
images into model inputs with timm's eval transform (`images`), one implementation for every command.

Imports only the base modules (errors, paths, progress).
"""
