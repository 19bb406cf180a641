"""`python -m keras_transformer.export.web`: the web page's npm packages, installed now (`make web-packages`)."""

from keras_transformer.export.web import main

main()
