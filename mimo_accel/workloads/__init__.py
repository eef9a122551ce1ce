"""Workload profiles: what a training mix looks like to the planners, as a small TOML file.

A profile describes the samples of a workload (images per sample, image sizes, text tokens, and
optional audio and video), the model's image resize rule, the default parallel layout, and a
scaled-down ``[rehearsal]`` version small enough to run on CPUs. The shipped profiles are this
package's data (``mimo_accel/workloads/*.toml``); :func:`load_profile` takes a name or a path.
Pure: numpy and the standard library. One idea a module: :mod:`~mimo_accel.workloads.dist` (the
distributions), :mod:`~mimo_accel.workloads.profile` (a profile and what it draws),
:mod:`~mimo_accel.workloads.loading` (the file format, read and checked). The offline tools and the
rehearsal use them; a training job never imports them.
"""

from mimo_accel.workloads.dist import Dist
from mimo_accel.workloads.loading import (PROFILES_DIR, REHEARSAL_MAX_IMAGES, REHEARSAL_MAX_PATCHES,
                                          REHEARSAL_MAX_SEQ_LENGTH, ProfileError, list_profiles, load_profile,
                                          parse_profile)
from mimo_accel.workloads.profile import (AUDIO, VIDEO, VISION, AudioProfile, Profile, Rehearsal, RehearsalSample,
                                          SampleTable, VideoProfile)

__all__ = [
    "AUDIO",
    "PROFILES_DIR",
    "REHEARSAL_MAX_IMAGES",
    "REHEARSAL_MAX_PATCHES",
    "REHEARSAL_MAX_SEQ_LENGTH",
    "VIDEO",
    "VISION",
    "AudioProfile",
    "Dist",
    "Profile",
    "ProfileError",
    "Rehearsal",
    "RehearsalSample",
    "SampleTable",
    "VideoProfile",
    "list_profiles",
    "load_profile",
    "parse_profile",
]
