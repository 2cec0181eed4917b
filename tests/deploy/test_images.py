"""The images' runtime stages are complete (deploy/docker/*.Dockerfile). No container engine runs
here, so instead of starting the images this checks, for the binaries this build made, that every
shared library `ldd` lists comes from a Debian package the runtime stage installs (or one apt pulls
in with it), or from the base image's essential set (debian:12-slim: Priority required, with apt,
and their dependencies), `dpkg -S` mapping each library to its package; the files under
/usr/share the binary reads (Chart.js for the router's dashboard) likewise. The package list is
parsed from the Dockerfile itself, so removing a needed package fails here. The CUDA image's CUDA
libraries (not Debian packages here: the toolkit on this machine is NVIDIA's) are mapped by name
to NVIDIA's runtime packages, which its runtime stage must name for the toolkit the image builds
with (CUDA_PKG; the toolkit here may be another major version: then only the names are compared);
with a build that has no CUDA, that part is reported as skipped. In a build with CUDA those
libraries are the CUDA module's (libswitchyard-cuda.so, next to the worker), which the image must
copy to where the worker looks for it. Its CUDA architectures include
every one CMakeLists.txt builds by default, and sm_86 and sm_89. Also: each image builds with the
project's setup script and the right SY_CUDA, copies the binary to its entrypoint, runs as a
non-root user.

    .venv/bin/python tests/deploy/test_images.py --router build/router/switchyard-router \
        --worker build/worker/switchyard-worker           (ctest: deploy/image-runtime)"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from deploy_common import ROOT, Report, parse_args, skip  # noqa: E402

DOCKER = os.path.join(ROOT, "deploy", "docker")
# Image → (binary, whether it is a CUDA build).
IMAGES = {"router.Dockerfile": ("router", False), "worker.Dockerfile": ("worker", False),
          "worker-cuda.Dockerfile": ("worker", True)}
# CUDA sonames → NVIDIA's package stem (the package is STEM-MAJOR-MINOR in NVIDIA's repository).
CUDA_PACKAGES = {"libcudart": "cuda-cudart", "libcublas": "libcublas", "libcublasLt": "libcublas",
                 "libnvrtc": "cuda-nvrtc", "libcurand": "libcurand", "libcufft": "libcufft",
                 "libcusparse": "libcusparse", "libcusolver": "libcusolver", "libnvJitLink": "libnvjitlink"}
SLIM_BASES = ("debian:12-slim", "debian:bookworm-slim")
# GPUs the CUDA image must be compiled for besides CMakeLists.txt's default (Ampere A10/A40, Ada L4/L40S).
CUDA_IMAGE_EXTRA_ARCHS = {"86", "89"}


def cmake_default_cuda_archs():
    """The CUDA architectures CMakeLists.txt sets when none is given."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"set\(CMAKE_CUDA_ARCHITECTURES ([0-9 ]+) CACHE", f.read())
    return set(m.group(1).split()) if m else set()


# --- The Dockerfile ---------------------------------------------------------------------------

class Stage:
    def __init__(self, base, name):
        self.base, self.name = base, name
        self.args = {}
        self.instructions = []  # (KEYWORD, text with ARGs substituted)


def parse_dockerfile(path):
    """Stages with their instructions; continuation lines joined, comments dropped, ARG defaults
    (global ones re-declared in the stage included) substituted into each instruction."""
    lines, cur = [], ""
    with open(path) as f:
        for raw in f:
            s = raw.rstrip("\n")
            if not cur and s.lstrip().startswith("#"):
                continue
            if cur and s.lstrip().startswith("#"):
                continue  # a comment inside a continued instruction
            if s.endswith("\\"):
                cur += s[:-1] + " "
                continue
            cur += s
            if cur.strip():
                lines.append(cur.strip())
            cur = ""
    global_args, stages = {}, []

    def subst(text, args):
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)

    for line in lines:
        kw, _, rest = line.partition(" ")
        kw = kw.upper()
        if kw == "ARG":
            name, _, default = rest.strip().partition("=")
            if not stages:
                global_args[name] = default.strip('"')
            else:
                stages[-1].args[name] = default.strip('"') if default else global_args.get(name, "")
            continue
        if kw == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", subst(rest.strip(), global_args), re.I)
            stages.append(Stage(m.group(1), m.group(2)))
            continue
        if stages:
            stages[-1].instructions.append((kw, subst(rest.strip(), stages[-1].args)))
    return stages


def apt_packages(stage):
    """The packages every `apt-get install` of the stage names."""
    pkgs = []
    for kw, text in stage.instructions:
        if kw != "RUN":
            continue
        for cmd in re.split(r"&&|;|\|\|", text):
            words = cmd.split()
            if "apt-get" in words and "install" in words:
                for w in words[words.index("install") + 1:]:
                    if not w.startswith("-") and "=" not in w:
                        pkgs.append(w)
    return pkgs


def exec_form(stage, kw):
    import json
    for k, text in reversed(stage.instructions):
        if k == kw:
            try:
                return json.loads(text)
            except ValueError:
                return None
    return None


# --- Debian packages ----------------------------------------------------------------------------

def installed_db():
    """{package: (essential, priority, [dependency alternatives])} for the packages installed here,
    and {virtual name: [providers]}."""
    out = subprocess.run(["dpkg-query", "-W", "-f",
                          "${Package}\t${Essential}\t${Priority}\t${Pre-Depends}\t${Depends}\t${Provides}\t${db:Status-Status}\n"],
                         capture_output=True, text=True, check=True).stdout
    db, provides = {}, {}
    for line in out.splitlines():
        pkg, ess, prio, pre, dep, prov, status = (line.split("\t") + [""] * 7)[:7]
        if status != "installed":
            continue
        alts = []
        for group in filter(None, (pre + ", " + dep).split(",")):
            names = [re.sub(r"[:(].*", "", a.strip()).strip() for a in group.split("|")]
            names = [n for n in names if n]
            if names:
                alts.append(names)
        db[pkg] = (ess == "yes", prio, alts)
        for p in filter(None, prov.split(",")):
            provides.setdefault(re.sub(r"[:(].*", "", p.strip()).strip(), []).append(pkg)
    return db, provides


def closure(roots, db, provides):
    """What apt installs for `roots` with --no-install-recommends: Depends and Pre-Depends, the
    first alternative apt could take (an installed package, or a virtual one's installed provider)."""
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in seen or p not in db:
            continue
        seen.add(p)
        for names in db[p][2]:
            for n in names:
                if n in db:
                    todo.append(n)
                    break
                if provides.get(n):
                    todo.append(provides[n][0])
                    break
    return seen


def base_set(db, provides):
    """debian:12-slim: the Priority-required packages and apt (debootstrap's minbase), closed."""
    roots = [p for p, (ess, prio, _) in db.items() if ess or prio == "required"] + ["apt"]
    return closure(roots, db, provides)


def package_of(path):
    """The Debian package that owns a file (usr-merge aware), or None."""
    cands = [path, os.path.realpath(path)]
    for c in list(cands):
        if c.startswith("/lib"):
            cands.append("/usr" + c)
        elif c.startswith("/usr/lib"):
            cands.append(c[4:])
    for c in cands:
        out = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
        if out.returncode == 0:
            for line in out.stdout.splitlines():
                pkg, _, owned = line.partition(": ")
                if owned.strip() == c:
                    return pkg.split(":")[0].split(",")[0].strip()
    return None


def ldd(binary):
    """[(soname, resolved path or None)] as ldd lists them (vdso left out)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True)
    libs = []
    for line in out.stdout.splitlines():
        line = line.strip()
        m = re.match(r"(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))", line)
        if m:
            libs.append((m.group(1), m.group(3)))
        elif re.match(r"/\S+ \(0x", line):
            p = line.split()[0]
            libs.append((os.path.basename(p), p))
    return libs


def is_cuda_lib(soname, path):
    stem = soname.split(".so")[0]
    return stem in CUDA_PACKAGES or (path and "/cuda" in path and package_of(path) is None)


def share_files(binary):
    """Absolute /usr/share paths written in the binary that exist here (what it reads at run time)."""
    with open(binary, "rb") as f:
        data = f.read()
    paths = {m.decode() for m in re.findall(rb"/usr/share/[A-Za-z0-9_./+-]+", data)}
    return sorted(p for p in paths if os.path.isfile(p))


# --- The check --------------------------------------------------------------------------------

def main():
    a = parse_args()
    binaries = {"router": a.router, "worker": a.worker}
    for b in binaries.values():
        if not os.access(b, os.X_OK):
            skip(f"{b} is not built")
    for t in ("ldd", "dpkg", "dpkg-query"):
        if subprocess.run(["which", t], capture_output=True).returncode != 0:
            skip(f"{t} is missing")
    db, provides = installed_db()
    base = base_set(db, provides)
    r = Report()
    libs = {k: ldd(v) for k, v in binaries.items()}
    # A build with CUDA puts the CUDA backend in a module next to the worker, which links the CUDA
    # libraries (worker/model/cuda_module.hpp): the CUDA image must carry both.
    module = os.path.join(os.path.dirname(a.worker), "libswitchyard-cuda.so")
    libs["worker-cuda"] = libs["worker"] + (ldd(module) if os.path.isfile(module) else [])
    owners = {}
    for k, ls in libs.items():
        for soname, path in ls:
            if path and path not in owners:
                owners[path] = package_of(path)
    for image, (binary, cuda_image) in IMAGES.items():
        stages = parse_dockerfile(os.path.join(DOCKER, image))
        build, runtime = stages[0], stages[-1]
        r.check(len(stages) >= 2 and runtime.base in SLIM_BASES,
                f"{image}: multi-stage, runtime stage on {runtime.base}")
        run_text = " ".join(t for k, t in build.instructions if k == "RUN")
        r.check("deploy/setup.sh --build-deps" in run_text, f"{image}: build stage installs with deploy/setup.sh --build-deps")
        want_cuda = "-DSY_CUDA=ON" if cuda_image else "-DSY_CUDA=OFF"
        r.check(want_cuda in run_text and f"--target switchyard-{binary}" in run_text,
                f"{image}: build stage builds switchyard-{binary} with {want_cuda}")
        copies = [t for k, t in runtime.instructions if k == "COPY" and t.startswith("--from=")]
        entry = exec_form(runtime, "ENTRYPOINT") or []
        r.check(any(t.split()[-1] == (entry[0] if entry else None) and t.split()[-2].endswith(f"/{binary}/switchyard-{binary}")
                    for t in copies), f"{image}: entrypoint {entry[:1]} is the binary copied from the build stage")
        user = next((t for k, t in reversed(runtime.instructions) if k == "USER"), "root")
        r.check(user.split(":")[0] not in ("root", "0"), f"{image}: runs as a non-root user ({user})")
        listed = apt_packages(runtime)
        r.check(bool(listed), f"{image}: runtime stage installs {' '.join(listed)}")
        debian_listed = [p for p in listed if p in db]
        foreign = [p for p in listed if p not in db]
        installs = closure(debian_listed, db, provides)
        cuda_libs = []
        if cuda_image:
            r.check("--target switchyard-worker switchyard-cuda" in run_text,
                    f"{image}: build stage builds the CUDA module (switchyard-cuda) with the worker")
            bindir = os.path.dirname(entry[0]) if entry else ""
            places = {f"{bindir}/libswitchyard-cuda.so", f"{os.path.dirname(bindir)}/lib/switchyard/libswitchyard-cuda.so"}
            r.check(any(t.split()[-2].endswith("/worker/libswitchyard-cuda.so") and t.split()[-1] in places
                        for t in copies), f"{image}: the CUDA module is copied to where the worker looks for it",
                    f"one of {sorted(places)}")
        for soname, path in libs["worker-cuda" if cuda_image else binary]:
            if path is None:
                r.check(False, f"{image}: {soname} resolves here", "ldd: not found")
                continue
            if is_cuda_lib(soname, path):
                cuda_libs.append((soname, path))
                continue
            pkg = owners.get(path)
            if pkg is None:
                r.check(False, f"{image}: {soname} comes from a Debian package", f"{path}: dpkg -S finds no owner")
            elif pkg in debian_listed:
                r.check(True, f"{image}: {soname} from {pkg} (installed by the runtime stage)")
            elif pkg in installs:
                r.check(True, f"{image}: {soname} from {pkg} (a dependency of what the runtime stage installs)")
            elif pkg in base:
                r.check(True, f"{image}: {soname} from {pkg} (in the base image's essential set)")
            else:
                r.check(False, f"{image}: {soname} is provided in the image",
                        f"its package {pkg} is neither installed by the runtime stage nor in the base image")
        for f in share_files(binaries[binary]):
            pkg = package_of(f)
            r.check(pkg is not None and (pkg in installs or pkg in base),
                    f"{image}: {f}, which the binary reads, comes with {pkg}")
        if not cuda_image:
            if cuda_libs:
                print(f"note: {image}: this build links {len(cuda_libs)} CUDA libraries "
                      f"({', '.join(s for s, _ in cuda_libs)}); the image builds with -DSY_CUDA=OFF, without them")
            r.check(not [p for p in foreign], f"{image}: every package it installs is a Debian package", " ".join(foreign))
            continue
        ver, pkg = runtime.args.get("CUDA_VERSION", ""), runtime.args.get("CUDA_PKG", "")
        r.check(bool(ver) and pkg == ver.replace(".", "-"),
                f"{image}: CUDA_VERSION {ver} and CUDA_PKG {pkg} name the same toolkit")
        m = re.search(r'-DCMAKE_CUDA_ARCHITECTURES="?([0-9;]+)', run_text)
        archs = set(m.group(1).split(";")) if m else set()
        want = cmake_default_cuda_archs() | CUDA_IMAGE_EXTRA_ARCHS
        r.check(len(want) > len(CUDA_IMAGE_EXTRA_ARCHS) and want <= archs,
                f"{image}: compiled for sm_{', sm_'.join(sorted(archs))}: CMakeLists.txt's default and sm_86, sm_89",
                f"wants {sorted(want)}")
        if not cuda_libs:
            print(f"SKIP (this part): {image}: {binaries[binary]} has no CUDA module (a build without nvcc), "
                  "so the CUDA runtime packages cannot be checked against it")
            continue
        for soname, path in cuda_libs:
            stem, major = soname.split(".so")[0], soname.split(".so.")[-1].split(".")[0]
            pkg_stem = CUDA_PACKAGES.get(stem)
            names = [p for p in foreign if pkg_stem and re.fullmatch(rf"{re.escape(pkg_stem)}-(\d+)-(\d+)", p)]
            if major != pkg.split("-")[0]:
                print(f"note: {image}: {soname} is CUDA {major} here; the image builds with CUDA {ver}, "
                      f"so its package is checked by name ({pkg_stem}-{pkg})")
            r.check(f"{pkg_stem}-{pkg}" in names, f"{image}: {soname} ({path}) from NVIDIA's {pkg_stem}-{pkg} package",
                    f"runtime stage installs {names or 'none of them'}")
        r.check(all(re.fullmatch(r"(cuda-[a-z]+|lib[a-z]+)-\d+-\d+", p) for p in foreign),
                f"{image}: the packages not in Debian are NVIDIA's CUDA packages ({' '.join(foreign)})")
    r.close()


if __name__ == "__main__":
    main()
