"""What pyproject.toml cannot say: the startup hook, mimo_accel.pth, goes to the root of
site-packages, where Python runs it at every start (as coverage's and pytest-cov's do). setuptools
places package data inside the package only, so build_py copies it to the root of what is built: a
wheel's root installs into site-packages; an editable wheel is assembled from what setuptools'
editable_wheel points install_lib at (its build_lib is a scratch directory left out)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK = os.path.join("mimo_accel", "_bootstrap", "mimo_accel.pth")


class build_py_with_startup_hook(build_py):
    def run(self):
        super().run()
        root = self.build_lib
        if getattr(self, "editable_mode", False):
            root = self.get_finalized_command("install").install_lib
        self.copy_file(HOOK, os.path.join(root, os.path.basename(HOOK)), preserve_mode=False)


setup(cmdclass={"build_py": build_py_with_startup_hook})
