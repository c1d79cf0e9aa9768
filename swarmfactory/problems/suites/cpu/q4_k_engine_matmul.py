from .qengine_k import QT, make_problem
PROBLEM = make_problem(QT.Q4_K)
