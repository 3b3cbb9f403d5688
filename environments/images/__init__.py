"""Sandbox images: a debootstrap base and one Dockerfile per environment (see build.py)."""

from environments.images.build import BuiltImage, build_images, environment_names, image_tag

__all__ = ["BuiltImage", "build_images", "environment_names", "image_tag"]
