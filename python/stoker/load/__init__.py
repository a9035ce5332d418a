"""The loaders (Loader, ImageLoader, TokenLoader, mix) and the stages a pass is built from; their
public names are stoker's own (`stoker.__all__`)."""
