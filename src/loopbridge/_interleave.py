"""Test-only: named points in the cross-thread handshakes where a test may pause a thread.

``hook`` is ``None`` outside tests, and each point costs one load and one
comparison.  A test installs a callable that, at a point it chose, blocks the
thread that reached it until another thread has done its part, so every order
of two writers can be run deterministically, without sleeps.

The points (each is *after* the step it names, before the next one):

* ``post.appended``: a poster appended its item, before it reads the wake flag;
* ``drain.flag_cleared``: a drain cleared the wake flag, before it pops;
* ``submit.registered``: an operation is in its owner's in-flight set, before
  its start is posted;
* ``die.marked``: a dying port is marked dead, before it fails what is in flight;
* ``stream.buffer_empty``: a stream's consumer found its buffer empty, before
  it reads the stream's outcome;
* ``start.first_step``: an owner-side task that did not start at once runs its
  first step, before it checks the owner again;
* ``give_up.cancel_written``: a caller that gives up wrote its cancel request,
  before it reads whether the owner started the operation (the withdrawal
  handshake, :mod:`loopbridge._operation`);
* ``settle.latched``: a writer took an operation out of the in-flight set (the
  settle latch: a result, a cancel, owner death, or a submit that failed),
  before it acts on it.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["hook"]

hook: Callable[[str], None] | None = None
