"""The wheel carries vitexport's shipped data under vitexport/shipped/: the calibration photos, the digits
checkpoint and the digits' calibration and held-out images. The checkout keeps them where the project's layout puts
them (calibration/, models/digits/); `vitexport.paths.shipped` finds them in either place. Everything else about the
build is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("calibration/photos", "calibration/digits", "models/digits")  # the same relative paths inside shipped/


class BuildPyWithShippedData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads the checkout itself
            return
        for rel in SHIPPED:
            shutil.copytree(ROOT / rel, Path(self.build_lib, "vitexport", "shipped", rel), dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithShippedData})
