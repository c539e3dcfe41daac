"""Build configuration that pyproject.toml cannot state without experimental tables.

- The C extensions (app/_native.c, app/engine/_model.c): ``ext_modules`` here is
  setuptools' stable interface (``[tool.setuptools.ext-modules]`` warns on every
  build as experimental).
- Alembic's script directory lives at the top level (``migrations/``) and installs
  as ``app.migrations``, so a wheel carries its migrations.
"""

from setuptools import Extension, find_packages, setup

setup(
    packages=[
        *find_packages(include=["app", "app.*"]),
        "app.migrations",
        "app.migrations.versions",
    ],
    package_dir={"app.migrations": "migrations"},
    package_data={"app.migrations": ["alembic.ini", "script.py.mako"]},
    ext_modules=[
        Extension(
            "app._native",
            sources=["app/_native.c"],
            extra_compile_args=["-O3"],
            libraries=["crypto"],
        ),
        Extension("app.engine._model", sources=["app/engine/_model.c"], extra_compile_args=["-O2"]),
    ],
)
