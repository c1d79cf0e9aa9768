from .qengine_k import QT, make_problem
PROBLEM = make_problem(QT.Q6_K)
