"""Map the repo's top-level folders onto the ``toolfleet.*`` namespace.

``toolfleet`` itself is an implicit namespace package; each folder becomes one
sub-package, and ``find_packages`` per folder keeps nested sub-packages in the wheel.

Editable installs (``pip install -e .``) are setuptools' *strict* ones: a ``.pth`` file puts
a tree of links to the source files (``build/__editable__.toolfleet-*``) on ``sys.path``, the
layout a wheel installs. Type checkers and IDEs read ``.pth`` paths; setuptools' default
(lenient) editable install maps this layout with an import hook instead, which runs only in
Python, so mypy would not find ``toolfleet.*`` in a project that installs the checkout. The
cost: a module added or renamed after the install needs ``pip install -e .`` again (edits
to existing files show at once). ``--config-settings editable_mode=lenient`` picks the hook.
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

setup(
    packages=packages,
    package_dir=package_dir,
    options={"editable_wheel": {"mode": "strict"}},
)
