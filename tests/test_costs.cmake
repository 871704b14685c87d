# Estimated seconds (COST) of the longest test entries, so that a tree with no CTest history
# (a fresh clone: no Testing/Temporary/CTestCostData.txt) starts them first, as CTest does from
# its second run on, instead of in the order the binaries list them: one that starts last
# ends the run tens of seconds after the others. Included by CTest after every directory's tests
# are known (tests/CMakeLists.txt, TEST_INCLUDE_FILES); a name that no longer exists is ignored,
# and only the order changes. Seconds: each entry's time in a CI run of the whole suite on a
# nearly quiet 2-core machine (5d4e475); the test on both backends twice its time on gloo there.
set_tests_properties("comm: every op, dtype, reduce op and size matches the local reference" PROPERTIES COST 81)
set_tests_properties("interleavings over etcd: a member's will fires at each point of the closer's join" PROPERTIES COST 42)
set_tests_properties("hostile clients: state forged while an open store's job joins ends the job cleanly" PROPERTIES COST 40)
set_tests_properties("comm: two hosts: hierarchical collectives and mixed groups match the reference" PROPERTIES COST 38)
set_tests_properties("interleavings over etcd: a member dies at each point of the exit barrier (finish, leave)" PROPERTIES COST 35)
set_tests_properties("interleavings over etcd: a member's link is cut at each point of a join (the closer's, its own) and of the exit barrier" PROPERTIES COST 33)
set_tests_properties("interleavings over etcd: a member dies at each point of a newcomer's join (one, and MIN)" PROPERTIES COST 26)
set_tests_properties("interleavings over etcd: a spare dies at each point of the survivors' re-forming join" PROPERTIES COST 24)
set_tests_properties("drun.torch.resilient under --recovery restart runs again from step 0" PROPERTIES COST 24)
set_tests_properties("drun.torch.resilient on the drun backend: rank 2 SIGKILLed during the recovery of rank 0, the replacements of both generations join generation 2" PROPERTIES COST 24)
set_tests_properties("drun.torch.resilient on gloo: rank 2 SIGKILLed during the recovery of rank 0, the replacements of both generations join generation 2" PROPERTIES COST 23)
set_tests_properties("interleavings over etcd: a member dies at each point of its own re-forming join" PROPERTIES COST 23)
set_tests_properties("drun.torch.resilient on the drun backend: ranks 1 and 0 SIGKILLed, two recoveries in place, the parameters of a run without a failure" PROPERTIES COST 22)
set_tests_properties("daemon memory: large known values, large sets, many waiters and a large will stay under the stated bound" PROPERTIES COST 21)
set_tests_properties("vacancy interleavings: a second spare takes its look at each point of the first's take" PROPERTIES COST 21)
set_tests_properties("drun.torch.resilient on gloo and on the drun backend: a node SIGKILLed with no spare, the survivors shrink in place with DDP, equal parameters after" PROPERTIES COST 40)
set_tests_properties("drun.torch.resilient on gloo: rank 0 SIGKILLed, its group re-created over the workers' store, the parameters of a run without a failure" PROPERTIES COST 19)
set_tests_properties("torch backend drun: the tutorial programs on one node x 4 give gloo's results" PROPERTIES COST 18)
set_tests_properties("torchrun compat: single-node lines (--standalone, = and space forms, PET_ variables, --max-restarts, --role, accepted no-ops)" PROPERTIES COST 18)
set_tests_properties("a standby worker takes a SIGKILLed rank: its pid, the rank's prefix and log file, the parameters of a run without a failure" PROPERTIES COST 18)
set_tests_properties("torchrun compat: rendezvous lines (--nnodes MIN:MAX, --rdzv-backend -endpoint -id -conf, nproc cpu) and two agents" PROPERTIES COST 17)
set_tests_properties("interleavings: a member's will fires at each point of the closer's join" PROPERTIES COST 16)
