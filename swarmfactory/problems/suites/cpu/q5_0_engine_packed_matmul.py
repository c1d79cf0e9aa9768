from .qengine_packed import QT, make_problem
PROBLEM = make_problem(QT.Q5_0)
