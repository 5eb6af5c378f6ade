"""Map the repo's top-level folders onto the ``toolfleet.*`` namespace.

``toolfleet`` itself is an implicit namespace package; each folder becomes one
sub-package, and ``find_packages`` per folder keeps nested sub-packages in the wheel.
"""

from setuptools import find_packages, setup

ROOTS = {
    "shared": "toolfleet.shared",
    "producer": "toolfleet.producer",
    "worker": "toolfleet.worker",
    "extensions": "toolfleet.extensions",
    "testing": "toolfleet.testing",
    "ui": "toolfleet.ui",
}

package_dir: dict[str, str] = {}
packages: list[str] = []
for folder, name in ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    for sub in find_packages(where=folder):
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(packages=packages, package_dir=package_dir)
